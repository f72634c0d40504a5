# The model libraries after the inventory: estimator, planner, simulator.
# Each is built from its folder when the folder has sources, so the tree
# builds at every stage of its growth. Dependency direction (DESIGN.md):
# inventory -> {estimator, planner} -> simulator.
set(PREFLIGHT_MODEL_LIBRARIES preflight_inventory preflight_recipe)

file(GLOB _estimator_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/estimator/*.cc)
if(_estimator_sources)
  preflight_library(preflight_estimator estimator)
  target_link_libraries(preflight_estimator PUBLIC preflight_inventory)
  list(PREPEND PREFLIGHT_MODEL_LIBRARIES preflight_estimator)
endif()

file(GLOB _planner_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/planner/*.cc)
if(_planner_sources)
  preflight_library(preflight_planner planner)
  target_link_libraries(preflight_planner PUBLIC preflight_inventory)
  if(TARGET preflight_estimator)
    target_link_libraries(preflight_planner PUBLIC preflight_estimator)
  endif()
  target_link_libraries(preflight_planner PRIVATE Threads::Threads)
  list(PREPEND PREFLIGHT_MODEL_LIBRARIES preflight_planner)
endif()

file(GLOB _simulator_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/simulator/*.cc)
if(_simulator_sources)
  preflight_library(preflight_simulator simulator)
  target_link_libraries(preflight_simulator PUBLIC ${PREFLIGHT_MODEL_LIBRARIES} PRIVATE Eigen3::Eigen Threads::Threads)
  list(PREPEND PREFLIGHT_MODEL_LIBRARIES preflight_simulator)
endif()
