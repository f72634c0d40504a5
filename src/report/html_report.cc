// The `--html` page (include/preflight/report/html_report.h): the command's
// JSON embedded, drawn by an inline script as inline SVG. The script writes
// every drawn figure into data- attributes and, only after everything drew,
// "ok" into #preflight-status (an error marker from window.onerror
// otherwise), so a headless browser can check the page (tests/html_page_test.cc).
#include "preflight/report/html_report.h"

#include <algorithm>
#include <set>
#include <string>

#include <fmt/format.h>

#include "preflight/planner/mesh.h"
#include "preflight/report/format.h"
#include "preflight/report/plan_report.h"
#include "preflight/report/sweep_report.h"

namespace preflight {
namespace {

/// JSON inside a <script> element: "<" written as \u003c, so no "</script>"
/// or "<!--" in a recipe name or formula can end the element early.
std::string ScriptSafe(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (char c : json) {
    if (c == '<') {
      out += "\\u003c";
    } else {
      out += c;
    }
  }
  return out;
}

nlohmann::json CategoriesJson() {
  nlohmann::json out = nlohmann::json::array();
  for (int i = 0; i < kNumCategories; ++i) {
    const auto c = static_cast<Category>(i);
    out.push_back({{"key", Key(c)}, {"label", Label(c)}, {"color", CategoryColor(c)}});
  }
  return out;
}

constexpr const char* kStyle = R"css(
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 24px 40px; color: #222; max-width: 1400px; }
h1 { font-size: 20px; margin: 18px 0 4px; } h2 { font-size: 17px; margin: 26px 0 6px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin: 18px 0 4px; }
.meta { color: #555; margin: 2px 0; } .verdict { font-weight: bold; margin: 6px 0; }
.ok { color: #1a7f37; } .bad { color: #cb181d; } .warn { color: #b35806; }
.scroll { overflow-x: auto; } svg { display: block; } svg text { font: 11px system-ui, sans-serif; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 3px 8px; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.formula { font-family: ui-monospace, monospace; font-size: 12px; max-width: 640px; }
.legend span { display: inline-block; margin: 2px 12px 2px 0; }
.legend i { display: inline-block; width: 11px; height: 11px; margin-right: 4px; vertical-align: -1px; }
.controls label { margin-right: 12px; } .controls { margin: 6px 0; }
#preflight-tip { position: absolute; display: none; background: #fffff4; border: 1px solid #999; padding: 6px 8px;
  font-size: 12px; white-space: pre-wrap; max-width: 640px; pointer-events: none; box-shadow: 2px 2px 6px #0003; }
#preflight-status { color: #888; font-size: 11px; margin-top: 30px; } #preflight-status.error { color: #cb181d; }
section.recipe { margin-top: 10px; } details.explain { margin: 10px 0; } details.explain summary { cursor: pointer; font-weight: bold; }
)css";

constexpr const char* kScript = R"js(
(function () {
  'use strict';
  var statusBox = document.getElementById('preflight-status');
  window.onerror = function (message, source, line) {
    statusBox.textContent = 'error: ' + message + ' (line ' + line + ')';
    statusBox.setAttribute('class', 'error');
  };
  // Nothing may load from outside the page (the Content-Security-Policy blocks it): a blocked load is an error too.
  document.addEventListener('securitypolicyviolation', function (ev) {
    window.onerror('blocked by the page\'s Content-Security-Policy: ' + ev.blockedURI, '', 0);
  });
  var data = JSON.parse(document.getElementById('preflight-data').textContent);
  var main = document.getElementById('preflight-main');
  var tip = document.getElementById('preflight-tip');
  var SVG = 'http://www.w3.org/2000/svg';
  var GIB = 1073741824;
  var counts = {recipes: 0, segments: 0, ranks: 0, axes: 0, step_parts: 0, points: 0, check_rows: 0};

  function make(ns, tag, attrs, parent, text) {
    var e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (var k in attrs) {
      if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
    }
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function h(tag, attrs, parent, text) { return make(null, tag, attrs, parent, text); }
  function s(tag, attrs, parent, text) { return make(SVG, tag, attrs, parent, text); }
  function gib(b) { return (b / GIB).toFixed(2) + ' GiB'; }
  function ms(x) { return (x * 1e3).toFixed(2) + ' ms'; }
  function fixed(x) { return x.toFixed(2); }
  function human(b) {
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], v = Math.abs(b), u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
    return (b < 0 ? '-' : '') + v.toFixed(2) + ' ' + units[u];
  }
  function niceStep(top) {
    var raw = top / 6, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }
  function groupColor(g) {
    if (g < 0) return '#dddddd';
    return 'hsl(' + ((g * 137.508) % 360).toFixed(1) + ',62%,' + (g % 2 ? 52 : 68) + '%)';
  }
  function label(key) {
    for (var i = 0; i < data.categories.length; i++) {
      if (data.categories[i].key === key) return data.categories[i].label;
    }
    return key;
  }
  function layoutText(l) {
    var t = 'tp ' + l.tp + (l.sp ? ' (sp)' : '') + ' · cp ' + l.cp + ' · pp ' + l.pp + ' · vpp ' + l.vpp + ' · dp ' + l.dp;
    if (l.ep > 1 || l.expert_tp > 1) t += ' · ep ' + l.ep + ' · expert_tp ' + l.expert_tp;
    if (l.dp_replicate > 1) t += ' · dp_replicate ' + l.dp_replicate;
    return t + ' · zero ' + l.zero + ' · micro-batch ' + l.micro_batch + (l.micro_batches ? ' × ' + l.micro_batches : '') +
        ' · recompute ' + l.recompute + (l.schedule ? ' · ' + l.schedule : '');
  }

  document.addEventListener('mousemove', function (ev) {
    var t = ev.target && ev.target.closest ? ev.target.closest('[data-tip]') : null;
    if (!t) { tip.style.display = 'none'; return; }
    tip.textContent = t.getAttribute('data-tip');
    tip.style.display = 'block';
    var x = ev.pageX + 14, room = document.documentElement.clientWidth - tip.offsetWidth - 8;
    tip.style.left = Math.max(0, Math.min(x, room)) + 'px';
    tip.style.top = (ev.pageY + 14) + 'px';
  });

  // ---- memory geometry per stage -------------------------------------------
  function segmentTip(part, i, key, bytes) {
    var st = part.fit.stages[i];
    var t = 'stage ' + st.pipeline_rank + ' · ' + label(key) + '\n' + gib(bytes) + ' (' + bytes + ' bytes), ' +
        (100 * bytes / st.total_bytes).toFixed(1) + '% of the stage\'s ' + gib(st.total_bytes);
    if (key === 'activations') {
      var f = st.activations_by_family_bytes, split = [];
      for (var k in f) { if (f[k] > 0) split.push((k === 'embedding_head' ? 'embedding/head' : k) + ' ' + gib(f[k])); }
      if (split.length) t += '\nof which ' + split.join(', ');
    }
    var lines = (part.explain_by_stage[i] || []).filter(function (e) { return e.category === key; });
    lines.forEach(function (e) {
      t += '\n\n• ' + e.item + ': ' + human(e.bytes) + '\n  = ' + e.formula + (e.inputs ? '\n  with ' + e.inputs : '');
    });
    return t;
  }

  function memoryChart(part, parent) {
    var fit = part.fit, stages = fit.stages, n = stages.length;
    var capacity = fit.device.capacity_bytes, floor = capacity - fit.verdict.min_headroom_bytes;
    var top = capacity;
    stages.forEach(function (st) { top = Math.max(top, st.total_bytes); });
    top *= 1.08;
    var bar = Math.max(14, Math.min(80, Math.floor(820 / n) - 12)), gap = Math.max(6, Math.round(bar / 3));
    var left = 56, pad = 26, plotH = 380, rotate = bar < 40;
    var width = left + n * (bar + gap) + gap + 10, height = pad + plotH + (rotate ? 70 : 46);
    var perGib = plotH / (top / GIB);
    function y(bytes) { return pad + plotH - bytes / GIB * perGib; }
    var box = h('div', {'class': 'scroll'}, parent);
    var svg = s('svg', {'class': 'chart memory', width: width, height: height, viewBox: '0 0 ' + width + ' ' + height,
                        'data-px-per-gib': perGib}, box);
    var defs = s('defs', {}, svg);
    var pattern = s('pattern', {id: 'over-' + counts.recipes, width: 8, height: 8, patternUnits: 'userSpaceOnUse',
                                patternTransform: 'rotate(45)'}, defs);
    s('rect', {width: 8, height: 8, fill: '#fcbba1'}, pattern);
    s('line', {x1: 0, y1: 0, x2: 0, y2: 8, stroke: '#cb181d', 'stroke-width': 4}, pattern);
    var step = niceStep(top / GIB);
    for (var g = 0; g <= top / GIB; g += step) {
      s('line', {x1: left, x2: width - 10, y1: fixed(y(g * GIB)), y2: fixed(y(g * GIB)), stroke: '#eee'}, svg);
      s('text', {x: left - 6, y: fixed(y(g * GIB) + 4), 'text-anchor': 'end'}, svg, String(Math.round(g)));
    }
    s('text', {x: 12, y: pad + plotH / 2, transform: 'rotate(-90 12 ' + (pad + plotH / 2) + ')', 'text-anchor': 'middle'},
      svg, 'GiB per rank');
    stages.forEach(function (st, i) {
      var x = left + gap + i * (bar + gap), base = 0, over = st.total_bytes > capacity;
      var grp = s('g', {'class': 'stage', 'data-stage': st.pipeline_rank, 'data-total-bytes': String(st.total_bytes)}, svg);
      data.categories.forEach(function (c) {
        var b = st.memory_bytes[c.key];
        if (!(b > 0)) return;
        s('rect', {'class': 'segment', x: x, y: fixed(y(base + b)), width: bar, height: fixed(b / GIB * perGib),
                   fill: c.color, 'data-stage': st.pipeline_rank, 'data-category': c.key, 'data-bytes': String(b),
                   'data-tip': segmentTip(part, i, c.key, b)}, grp);
        base += b;
        counts.segments += 1;
      });
      if (over) {
        s('rect', {'class': 'over', x: x - 2, y: fixed(y(st.total_bytes)), width: bar + 4,
                   height: fixed((st.total_bytes - capacity) / GIB * perGib), fill: 'url(#over-' + counts.recipes + ')',
                   stroke: '#cb181d', 'stroke-width': 2, opacity: 0.85,
                   'data-tip': 'stage ' + st.pipeline_rank + ' is ' + gib(st.total_bytes - capacity) +
                       ' over the capacity of ' + gib(capacity)}, grp);
      }
      var worst = i === fit.worst_stage;
      s('text', {x: x + bar / 2, y: fixed(y(base) - 5), 'text-anchor': 'middle', 'font-weight': 'bold',
                 fill: over ? '#cb181d' : '#222'}, grp, (base / GIB).toFixed(1) + (over ? ' !' : ''));
      var ly = pad + plotH + 14;
      s('text', rotate ? {x: x + bar / 2, y: ly, transform: 'rotate(45 ' + (x + bar / 2) + ' ' + ly + ')'}
                       : {x: x + bar / 2, y: ly, 'text-anchor': 'middle'},
        grp, (rotate ? '' : 'stage ') + st.pipeline_rank + (worst ? ' ▲' : ''));
    });
    var right = width - 10;
    s('line', {'class': 'capacity', x1: left, x2: right, y1: fixed(y(capacity)), y2: fixed(y(capacity)),
               stroke: '#cb181d', 'stroke-width': 2, 'data-bytes': String(capacity)}, svg);
    s('text', {x: left + 4, y: fixed(y(capacity) - 4), fill: '#cb181d'}, svg, 'capacity ' + gib(capacity));
    s('line', {'class': 'headroom-floor', x1: left, x2: right, y1: fixed(y(floor)), y2: fixed(y(floor)),
               stroke: '#cb181d', 'stroke-dasharray': '6 4', 'data-bytes': String(floor)}, svg);
    s('text', {x: right - 4, y: fixed(y(floor) + 12), fill: '#cb181d', 'text-anchor': 'end'}, svg, 'headroom floor');
    var legend = h('div', {'class': 'legend'}, parent);
    data.categories.slice().reverse().forEach(function (c) {
      var item = h('span', {}, legend);
      h('i', {style: 'background:' + c.color}, item);
      item.appendChild(document.createTextNode(c.label));
    });
    h('div', {'class': 'meta'}, parent, '▲ marks the worst stage; hover a segment for its bytes and formulas.');
  }

  function explainTable(part, parent) {
    var fit = part.fit;
    var details = h('details', {'class': 'explain'}, parent);
    h('summary', {}, details, 'Every figure with its formula and inputs (fit --explain), per stage');
    parent = details;
    var controls = h('div', {'class': 'controls'}, parent);
    controls.appendChild(document.createTextNode('stage '));
    var pick = h('select', {'class': 'explain-stage'}, controls);
    fit.stages.forEach(function (st, i) {
      var o = h('option', {value: i}, pick, String(st.pipeline_rank) + (i === fit.worst_stage ? ' (worst)' : ''));
      if (i === fit.worst_stage) o.selected = true;
    });
    var table = h('table', {'class': 'explain'}, parent);
    function fill(i) {
      table.textContent = '';
      table.setAttribute('data-stage', i);
      var head = h('tr', {}, table);
      ['category', 'item', 'bytes', 'formula and inputs'].forEach(function (c) { h('th', {}, head, c); });
      (part.explain_by_stage[i] || []).forEach(function (e) {
        var tr = h('tr', {'class': 'explain-row', 'data-category': e.category, 'data-bytes': String(e.bytes)}, table);
        h('td', {}, tr, label(e.category));
        h('td', {}, tr, e.item);
        h('td', {'class': 'num'}, tr, human(e.bytes));
        h('td', {'class': 'formula'}, tr, '= ' + e.formula + (e.inputs ? '\nwith ' + e.inputs : ''));
      });
    }
    pick.addEventListener('change', function () { fill(Number(pick.value)); });
    fill(fit.worst_stage);
  }

  function fitSummary(part, parent) {
    var fit = part.fit, v = fit.verdict;
    h('div', {'class': 'meta'}, parent, fit.recipe.file + ' · ' + fit.device.label + ', ' + fit.device.nodes +
      ' nodes × ' + fit.device.gpus_per_node + ' GPUs · ' + (fit.params.total / 1e9).toFixed(2) + ' B params');
    h('div', {'class': 'meta'}, parent, layoutText(fit.layout));
    var word = !v.fits ? 'DOES NOT FIT' : v.headroom_ok ? 'fits' : 'fits, below the headroom floor';
    h('div', {'class': 'verdict ' + (!v.fits ? 'bad' : v.headroom_ok ? 'ok' : 'warn'), 'data-fits': String(v.fits)},
      parent, word + ': ' + v.reason);
    var a = fit.advice;
    if (a && a.fits && a.dominant) {
      h('div', {'class': 'meta'}, parent, 'dominant: ' + label(a.dominant.category) + ', ' +
        (100 * a.dominant.share).toFixed(0) + '% of the worst rank (' + gib(a.dominant.bytes) + ')');
    }
    if (a && a.suggestions && a.suggestions.length) {
      h('div', {'class': 'meta'}, parent, 'changes that make it fit, cheapest first:');
      var list = h('ol', {}, parent);
      a.suggestions.forEach(function (sg) {
        h('li', {}, list, sg.summary + ': headroom ' + gib(sg.headroom_bytes) + (sg.headroom_ok ? '' : ', below the floor') +
          (a.step_s > 0 ? ', step ' + sg.step_s.toFixed(3) + ' s (' + (sg.step_change >= 0 ? '+' : '') +
                              (100 * sg.step_change).toFixed(1) + '%)' : ''));
      });
    }
    if (fit.balanced_cut) {
      var c = fit.balanced_cut;
      h('div', {'class': 'meta'}, parent, 'a ' + c.basis + '-balanced cut at layers [' + c.stage_boundaries.join(', ') +
        '] (parallel.stage_boundaries) takes the worst stage from ' + gib(c.worst_stage_total_bytes_before) + ' to ' +
        gib(c.worst_stage_total_bytes_after) + ' and the step from ' + c.step_s_before.toFixed(3) + ' s to ' +
        c.step_s_after.toFixed(3) + ' s');
    }
  }

  // ---- rank-to-node map ------------------------------------------------------
  function rankMap(part, parent) {
    var rg = part.rank_groups, plan = part.plan, gpn = rg.gpus_per_node;
    var axes = plan.groups.filter(function (g) { return rg.groups[g.axis] !== undefined; });
    if (!axes.length) return;
    // The first axis whose groups hold more than one rank (tp first when it does).
    var chosen = (axes.filter(function (g) { return g.size > 1; })[0] || axes[0]).axis;
    var controls = h('div', {'class': 'controls'}, parent);
    controls.appendChild(document.createTextNode('colour by the group of: '));
    var name = 'axis-' + counts.recipes;
    var caption = h('div', {'class': 'meta'}, parent);
    var cell = 22, gap = 3, left = 64, pad = 16, rows = Math.ceil(rg.shown / gpn);
    var width = left + gpn * (cell + gap) + 10, height = pad + rows * (cell + gap) + 6;
    var box = h('div', {'class': 'scroll'}, parent);
    var svg = s('svg', {'class': 'chart rank-map', width: width, height: height, viewBox: '0 0 ' + width + ' ' + height}, box);
    for (var gpu = 0; gpu < gpn; gpu++) {
      s('text', {x: left + gpu * (cell + gap) + cell / 2, y: pad - 4, 'text-anchor': 'middle'}, svg, String(gpu));
    }
    var cells = [];
    for (var r = 0; r < rg.shown; r++) {
      var nd = rg.coords.node[r], lg = rg.coords.local_gpu[r];
      if (lg === 0) s('text', {x: left - 6, y: pad + nd * (cell + gap) + cell - 5, 'text-anchor': 'end'}, svg, 'node ' + nd);
      var attrs = {'class': 'rank', x: left + lg * (cell + gap), y: pad + nd * (cell + gap), width: cell, height: cell,
                   'data-rank': r, 'data-node': nd, 'data-gpu': lg};
      ['tp', 'cp', 'dp', 'pp', 'ep', 'expert_tp', 'expert_dp'].forEach(function (k) { attrs['data-' + k] = rg.coords[k][r]; });
      axes.forEach(function (g) { attrs['data-group-' + g.axis] = rg.groups[g.axis][r]; });
      cells.push(s('rect', attrs, svg));
      counts.ranks += 1;
    }
    function paint(axis) {
      var info = axes.filter(function (g) { return g.axis === axis; })[0];
      caption.textContent = axis + ': ' + info.groups + ' groups of ' + info.size + ', ' +
          (info.intra_node ? 'inside a node (NVLink)' : 'across nodes (InfiniBand), up to ' + info.max_nodes_spanned +
                                                            ' nodes a group') +
          (rg.shown < rg.world ? ' · the first ' + rg.shown / gpn + ' of ' + rg.world / gpn + ' nodes drawn' : '');
      svg.setAttribute('data-axis', axis);
      cells.forEach(function (c) {
        var gi = Number(c.getAttribute('data-group-' + axis));
        c.setAttribute('fill', groupColor(gi));
        c.setAttribute('data-tip', 'rank ' + c.getAttribute('data-rank') + ' · node ' + c.getAttribute('data-node') +
          ' GPU ' + c.getAttribute('data-gpu') + '\n' + axis + ' group ' + (gi < 0 ? 'none' : gi) + '\ncoordinates: ' +
          ['tp', 'cp', 'dp', 'pp', 'ep', 'expert_tp', 'expert_dp'].map(function (k) {
            return k + ' ' + c.getAttribute('data-' + k);
          }).join(', '));
      });
    }
    axes.forEach(function (g) {
      var l = h('label', {}, controls);
      var input = h('input', {type: 'radio', name: name, value: g.axis}, l);
      if (g.axis === chosen) input.checked = true;
      input.addEventListener('change', function () { paint(g.axis); });
      l.appendChild(document.createTextNode(' ' + g.axis + ' (' + g.size + ')'));
    });
    paint(chosen);
  }

  // ---- communication per axis -------------------------------------------------
  // JSON objects come back with sorted keys: list axes and families in the planner's order.
  function inAxisOrder(plan, object) {
    var known = plan.groups.map(function (g) { return g.axis; });
    return Object.keys(object).sort(function (a, b) {
      var i = known.indexOf(a), j = known.indexOf(b);
      return (i < 0 ? 99 : i) - (j < 0 ? 99 : j) || (a < b ? -1 : 1);
    });
  }
  function linkOf(plan, axis) {
    var g = plan.groups.filter(function (x) { return x.axis === axis; })[0];
    return g ? (g.intra_node ? 'NVLink' : 'InfiniBand') : '';
  }
  function commChart(part, parent) {
    var plan = part.plan, slowest = plan.step.slowest_stage;
    var controls = h('div', {'class': 'controls'}, parent);
    controls.appendChild(document.createTextNode('pipeline rank '));
    var pick = h('select', {'class': 'comm-stage'}, controls);
    plan.communication.forEach(function (c, i) {
      var o = h('option', {value: i}, pick, String(c.pipeline_rank) + (c.pipeline_rank === slowest ? ' (slowest)' : ''));
      if (c.pipeline_rank === slowest) o.selected = true;
    });
    var box = h('div', {}, parent);
    function draw(i) {
      box.textContent = '';
      var c = plan.communication[i], keys = inAxisOrder(plan, c.send_bytes_by_axis).filter(function (k) {
        return c.send_bytes_by_axis[k] > 0;
      });
      var most = 1;
      keys.forEach(function (k) { most = Math.max(most, c.send_bytes_by_axis[k]); });
      var rowH = 22, left = 110, plotW = 560, width = left + plotW + 200, height = rowH * keys.length + 8;
      var svg = s('svg', {'class': 'chart comm', width: width, height: height, viewBox: '0 0 ' + width + ' ' + height,
                          'data-stage': c.pipeline_rank}, box);
      keys.forEach(function (k, j) {
        var b = c.send_bytes_by_axis[k], w = b / most * plotW;
        var items = c.items.filter(function (it) { return it.axis === k; });
        var tipText = k + ' (' + linkOf(plan, k) + '): ' + human(b) + ' sent per step by one rank\n' +
            items.map(function (it) {
              return it.collective + ' ' + it.pass + ' ' + it.what + ': ' + it.calls + ' calls of ' + human(it.payload_bytes) +
                  ' in groups of ' + it.group_size + ', sends ' + human(it.send_bytes) + ', ' + ms(it.seconds) + ' (' +
                  ms(it.exposed_seconds) + ' exposed)';
            }).join('\n');
        s('text', {x: left - 6, y: j * rowH + 15, 'text-anchor': 'end'}, svg, k);
        s('rect', {'class': 'comm-axis', x: left, y: j * rowH + 3, width: fixed(Math.max(w, 1)), height: rowH - 6,
                   fill: linkOf(plan, k) === 'NVLink' ? '#4292c6' : '#d6604d', 'data-axis': k, 'data-bytes': String(b),
                   'data-tip': tipText}, svg);
        s('text', {x: left + w + 6, y: j * rowH + 15}, svg, human(b) + ' · ' + linkOf(plan, k));
        counts.axes += 1;
      });
      h('div', {'class': 'meta'}, box, 'bytes one rank of pipeline rank ' + c.pipeline_rank +
        ' sends per step, by axis (blue NVLink, red InfiniBand); hover for the collectives');
    }
    pick.addEventListener('change', function () { draw(Number(pick.value)); });
    draw(plan.communication.findIndex(function (c) { return c.pipeline_rank === slowest; }));
  }

  // ---- step-time breakdown ---------------------------------------------------
  function barList(parent, cls, attr, entries, total, unitText) {
    var rowH = 22, left = 110, plotW = 560, width = left + plotW + 160, height = rowH * entries.length + 8;
    var svg = s('svg', {'class': 'chart ' + cls, width: width, height: height, viewBox: '0 0 ' + width + ' ' + height}, parent);
    entries.forEach(function (e, j) {
      var w = total > 0 ? e[1] / total * plotW : 0;
      s('text', {x: left - 6, y: j * rowH + 15, 'text-anchor': 'end'}, svg, e[0]);
      var a = {'class': cls, x: left, y: j * rowH + 3, width: fixed(Math.max(w, 1)), height: rowH - 6, fill: '#807dba',
               'data-seconds': String(e[1]), 'data-tip': e[0] + ': ' + ms(e[1]) + unitText};
      a[attr] = e[0];
      s('rect', a, svg);
      s('text', {x: left + w + 6, y: j * rowH + 15}, svg, ms(e[1]));
    });
  }
  function stepChart(part, parent) {
    var st = part.plan.step;
    h('div', {'class': 'meta'}, parent, 'step ' + ms(st.step_s) + ' · ' + Math.round(st.tokens_per_s) + ' tokens/s · MFU ' +
      (100 * st.mfu).toFixed(1) + '% · slowest pipeline rank ' + st.slowest_stage);
    var tail = Math.max(0, st.step_s - st.steady_s - st.bubble_s);
    var parts = [['steady', 'steady state: m micro-batches × the slowest stage', st.steady_s, '#6baed6'],
                 ['bubble', 'pipeline bubble (' + (100 * st.bubble_fraction).toFixed(1) + '% of the step)', st.bubble_s, '#fdae6b'],
                 ['tail', 'after the last backward: data-parallel exposed ' + ms(st.dp_exposed_s) + ', optimizer ' +
                     ms(st.optimizer_s + st.optimizer_step_s) + (st.host_offload_s > 0 ? ', host offload ' + ms(st.host_offload_s) : ''),
                  tail, '#74c476']];
    var left = 10, plotW = 860, width = plotW + 20, height = 52;
    var svg = s('svg', {'class': 'chart step', width: width, height: height, viewBox: '0 0 ' + width + ' ' + height,
                        'data-step-s': String(st.step_s)}, parent);
    var x = left;
    parts.forEach(function (p) {
      var w = st.step_s > 0 ? p[2] / st.step_s * plotW : 0;
      s('rect', {'class': 'step-part', x: fixed(x), y: 4, width: fixed(w), height: 26, fill: p[3], 'data-part': p[0],
                 'data-seconds': String(p[2]), 'data-tip': p[1] + ': ' + ms(p[2])}, svg);
      if (w > 70) s('text', {x: fixed(x + 4), y: 21}, svg, p[0] + ' ' + ms(p[2]));
      x += w;
      counts.step_parts += 1;
    });
    s('text', {x: left, y: 46}, svg, parts.map(function (p) { return p[0] + ' ' + ms(p[2]); }).join(' + ') + ' = step ' +
      ms(st.step_s));
    var fam = [];
    'AMERD'.split('').forEach(function (k) { if (st.compute_by_family_s[k] > 0) fam.push([k, st.compute_by_family_s[k]]); });
    if (st.head_compute_s > 0) fam.push(['head', st.head_compute_s]);
    var most = 0;
    fam.forEach(function (e) { most = Math.max(most, e[1]); });
    h('h3', {}, parent, 'Compute on pipeline rank ' + st.slowest_stage + ' by block family (all micro-batches)');
    barList(parent, 'compute-family', 'data-family', fam, most, ' of forward + backward + recompute');
    var exp = [];
    inAxisOrder(part.plan, st.exposed_by_axis_s).forEach(function (k) {
      if (st.exposed_by_axis_s[k] > 0) exp.push([k, st.exposed_by_axis_s[k]]);
    });
    if (exp.length) {
      most = 0;
      exp.forEach(function (e) { most = Math.max(most, e[1]); });
      h('h3', {}, parent, 'Exposed communication by axis');
      barList(parent, 'exposed-axis', 'data-axis', exp, most, ' not hidden behind compute');
    }
    var table = h('table', {'class': 'stage-times'}, parent);
    var head = h('tr', {}, table);
    ['pipeline rank', 'forward', 'backward', 'recompute', 'exposed comm', 'memory'].forEach(function (c) { h('th', {'class': 'num'}, head, c); });
    part.plan.stages.forEach(function (sg) {
      var tr = h('tr', {}, table);
      [String(sg.pipeline_rank), ms(sg.forward_s), ms(sg.backward_s), ms(sg.recompute_s), ms(sg.exposed_comm_s),
       sg.memory ? gib(sg.memory.total_bytes) : '-'].forEach(function (c) { h('td', {'class': 'num'}, tr, c); });
    });
    h('div', {'class': 'meta'}, parent, 'times per micro-batch');
  }

  // ---- sweep: the Pareto cloud -------------------------------------------------
  function sweepChart(sw, parent) {
    var byIndex = {};
    sw.layouts.forEach(function (l) { byIndex[l.index] = l; });
    var fitting = sw.layouts.filter(function (l) { return l.status === 'fits' || l.status === 'tight'; });
    var ownRow = sw.own === null || sw.own === undefined ? null : byIndex[sw.own];
    var plotted = fitting.slice();
    if (ownRow && ownRow.peak_bytes !== null) plotted.push(ownRow);
    var xMax = sw.capacity_bytes, lo = Infinity, hi = 0;
    plotted.forEach(function (l) { xMax = Math.max(xMax, l.peak_bytes); lo = Math.min(lo, l.step_s); hi = Math.max(hi, l.step_s); });
    xMax *= 1.05;
    if (!(lo < hi)) { lo = isFinite(lo) ? lo * 0.9 : 0; hi = lo > 0 ? lo / 0.9 * 1.1 : 1; }
    var padY = 0.05 * (hi - lo), yMin = Math.max(0, lo - padY), yMax = hi + padY;
    var left = 70, top = 16, plotW = 720, plotH = 440, width = left + plotW + 30, height = top + plotH + 50;
    function X(b) { return left + b / xMax * plotW; }
    function Y(t) { return top + plotH - (t - yMin) / (yMax - yMin) * plotH; }
    h('div', {'class': 'meta'}, parent, sw.evaluated + ' layouts on ' + sw.gpus + ' GPUs: ' + sw.counts.fits + ' fit, ' +
      sw.counts.tight + ' tight (under the headroom floor), ' + sw.counts.over_capacity + ' over capacity, ' +
      sw.counts.invalid + ' invalid; ' + fitting.length + ' fitting layouts drawn');
    if (sw.nothing_fits) {
      var why = sw.nothing_fits;
      h('div', {'class': 'verdict bad', 'data-invalid-rows': why.invalid_rows}, parent, 'no layout fits: ' + why.invalid_rows +
        ' invalid' + (why.invalid.length ? ' (most often ' + why.invalid.map(function (g) {
          return g.key + ': ' + g.rows;
        }).join(', ') + ')' : '') + ', ' + why.over_rows + ' over capacity or under the headroom floor; widen the ranges or add GPUs');
    }
    var box = h('div', {'class': 'scroll'}, parent);
    var svg = s('svg', {'class': 'chart sweep', width: width, height: height, viewBox: '0 0 ' + width + ' ' + height}, box);
    for (var k = 0; k <= 5; k++) {
      var b = xMax / 1.05 * k / 5, t = yMin + (yMax - yMin) * k / 5;
      s('line', {x1: fixed(X(b)), x2: fixed(X(b)), y1: top, y2: top + plotH, stroke: '#eee'}, svg);
      s('text', {x: fixed(X(b)), y: top + plotH + 16, 'text-anchor': 'middle'}, svg, (b / GIB).toFixed(0));
      s('line', {x1: left, x2: left + plotW, y1: fixed(Y(t)), y2: fixed(Y(t)), stroke: '#eee'}, svg);
      s('text', {x: left - 6, y: fixed(Y(t) + 4), 'text-anchor': 'end'}, svg, t.toPrecision(3));
    }
    s('text', {x: left + plotW / 2, y: height - 8, 'text-anchor': 'middle'}, svg, 'peak memory of the worst rank (GiB)');
    s('text', {x: 14, y: top + plotH / 2, transform: 'rotate(-90 14 ' + (top + plotH / 2) + ')', 'text-anchor': 'middle'},
      svg, 'step time (s)');
    s('line', {'class': 'capacity', x1: fixed(X(sw.capacity_bytes)), x2: fixed(X(sw.capacity_bytes)), y1: top,
               y2: top + plotH, stroke: '#cb181d', 'stroke-dasharray': '6 4'}, svg);
    function tipOf(l, what) {
      return what + ' #' + l.index + ': ' + layoutText(l) + '\npeak ' + gib(l.peak_bytes) + ', headroom ' + gib(l.headroom_bytes) +
          ', step ' + l.step_s.toFixed(3) + ' s, ' + Math.round(l.tokens_per_s) + ' tokens/s, MFU ' + (100 * l.mfu).toFixed(1) +
          '%\n' + l.status + (l.reason ? ': ' + l.reason : '');
    }
    var pareto = {};
    sw.pareto.forEach(function (i) { pareto[i] = true; });
    fitting.forEach(function (l) {
      if (pareto[l.index]) return;
      s('circle', {'class': 'layout', cx: fixed(X(l.peak_bytes)), cy: fixed(Y(l.step_s)), r: 2.5,
                   fill: l.status === 'tight' ? '#fdae6b' : '#bbbbbb', 'data-index': l.index,
                   'data-peak-bytes': String(l.peak_bytes), 'data-step-s': String(l.step_s), 'data-tip': tipOf(l, 'layout')}, svg);
      counts.points += 1;
    });
    var front = sw.pareto.map(function (i) { return fixed(X(byIndex[i].peak_bytes)) + ',' + fixed(Y(byIndex[i].step_s)); });
    if (front.length) s('polyline', {points: front.join(' '), fill: 'none', stroke: '#2166ac'}, svg);
    sw.pareto.forEach(function (i) {
      var l = byIndex[i];
      s('circle', {'class': 'pareto', cx: fixed(X(l.peak_bytes)), cy: fixed(Y(l.step_s)), r: 4.5, fill: '#2166ac',
                   'data-index': l.index, 'data-peak-bytes': String(l.peak_bytes), 'data-step-s': String(l.step_s),
                   'data-tip': tipOf(l, 'Pareto layout')}, svg);
      counts.points += 1;
    });
    if (ownRow && ownRow.peak_bytes !== null) {
      var ox = X(ownRow.peak_bytes), oy = Y(ownRow.step_s);
      s('path', {'class': 'own', d: 'M ' + fixed(ox) + ' ' + fixed(oy - 8) + ' l 8 8 l -8 8 l -8 -8 z', fill: '#d6604d',
                 stroke: 'black', 'data-index': ownRow.index, 'data-tip': tipOf(ownRow, 'the recipe\'s own layout')}, svg);
    }
    h('div', {'class': 'meta'}, parent, 'grey: a fitting layout · orange: under the headroom floor · blue: the Pareto front · ' +
      'red diamond: the recipe\'s own layout' + (ownRow ? (ownRow.peak_bytes === null ? ' (invalid here)' : '') :
                                                           ' (not in the swept space)') + ' · dashed: capacity');
    if (!sw.top.length) return;
    h('h3', {}, parent, 'Best by estimated tokens/s');
    var table = h('table', {'class': 'sweep-top'}, parent);
    var head = h('tr', {}, table);
    ['#', 'layout', 'peak', 'headroom', 'step', 'tokens/s', 'MFU'].forEach(function (c) { h('th', {}, head, c); });
    sw.top.forEach(function (i, j) {
      var l = byIndex[i], tie = sw.top_tie_groups[j];
      var tr = h('tr', {'class': 'top-row', 'data-index': i}, table);
      [tie === j + 1 ? String(j + 1) : '=' + tie, layoutText(l), gib(l.peak_bytes), gib(l.headroom_bytes),
       l.step_s.toFixed(3) + ' s', String(Math.round(l.tokens_per_s)), (100 * l.mfu).toFixed(1) + '%'].forEach(function (c, n) {
        h('td', {'class': n === 1 ? '' : 'num'}, tr, c);
      });
    });
    h('div', {'class': 'meta'}, parent, '=N: within the step-time model\'s uncertainty of row N: a tie, not a ranking');
  }

  // ---- check: the set of recipes -----------------------------------------------
  function checkTable(check, parent) {
    var sm = check.summary;
    h('div', {'class': 'verdict ' + (sm.exit_code === 0 ? 'ok' : 'bad')}, parent, sm.recipes + ' recipes: ' +
      (sm.recipes - sm.failed - sm.invalid) + ' pass, ' + sm.failed + ' fail, ' + sm.invalid + ' invalid' +
      (check.baseline ? ' · against ' + check.baseline : ''));
    var table = h('table', {'class': 'check'}, parent);
    var head = h('tr', {}, table);
    ['recipe', 'verdict', 'worst stage total', 'headroom', 'delta vs baseline', 'why'].forEach(function (c) { h('th', {}, head, c); });
    check.recipes.forEach(function (e) {
      var tr = h('tr', {'class': 'check-row', 'data-file': e.file, 'data-status': e.status,
                        'data-worst-total-bytes': e.worst_total_bytes === undefined ? '' : String(e.worst_total_bytes)}, table);
      var cell = h('td', {}, tr);
      var k = data.reports.findIndex(function (p) { return p.fit.recipe.file === e.file; });
      if (k >= 0) h('a', {href: '#recipe-' + k}, cell, e.file); else cell.textContent = e.file;
      h('td', {'class': e.status === 'pass' ? 'ok' : 'bad'}, tr, e.status);
      h('td', {'class': 'num'}, tr, e.worst_total_bytes === undefined ? '-' : gib(e.worst_total_bytes));
      h('td', {'class': 'num'}, tr, e.headroom_bytes === undefined ? '-' : gib(e.headroom_bytes));
      var d = e.baseline && e.baseline.delta_total_bytes !== undefined ? e.baseline.delta_total_bytes : null;
      h('td', {'class': 'num'}, tr, d === null ? (e.baseline ? e.baseline.state : '-') : (d >= 0 ? '+' : '') + gib(d));
      h('td', {}, tr, e.failures.concat(e.errors).join('; '));
      counts.check_rows += 1;
    });
  }

  // ---- the page ----------------------------------------------------------------
  if (data.check) {
    h('h2', {}, main, 'Check');
    checkTable(data.check, main);
  }
  data.reports.forEach(function (part, k) {
    var sec = h('section', {'class': 'recipe', id: 'recipe-' + k}, main);
    h('h2', {}, sec, part.fit.recipe.name);
    fitSummary(part, sec);
    h('h3', {}, sec, 'Memory per rank by pipeline stage');
    memoryChart(part, sec);
    explainTable(part, sec);
    if (part.plan) {
      h('h3', {}, sec, 'Ranks on nodes');
      rankMap(part, sec);
      h('h3', {}, sec, 'Communication per axis');
      commChart(part, sec);
      h('h3', {}, sec, 'Step time');
      stepChart(part, sec);
    }
    counts.recipes += 1;
  });
  if (data.sweep) {
    h('h2', {}, main, 'Step time against peak memory');
    sweepChart(data.sweep, main);
  }
  for (var key in counts) statusBox.setAttribute('data-' + key.replace('_', '-'), counts[key]);
  statusBox.textContent = 'ok';
})();
)js";

}  // namespace

nlohmann::json HtmlFitPart(const FitReport& report) {
  nlohmann::json by_stage = nlohmann::json::array();
  for (size_t s = 0; s < report.estimate.stages.size(); ++s) {
    by_stage.push_back(
        ExplanationsJson(ExplainRank(*report.inventory, report.layout, report.stages, static_cast<int64_t>(s))));
  }
  return {{"fit", FitJson(report)}, {"explain_by_stage", by_stage}};
}

nlohmann::json HtmlPlanPart(const Recipe& recipe, const Plan& plan) {
  const Mesh& m = plan.mesh;
  const auto shown = static_cast<size_t>(std::min<int64_t>(m.world, kMaxHtmlMapRanks));
  std::vector<int64_t> node, local_gpu, tp, cp, dp, pp, ep, expert_tp, expert_dp;
  for (size_t r = 0; r < shown; ++r) {
    const RankCoord& c = m.ranks[r];
    node.push_back(c.node);
    local_gpu.push_back(c.local_gpu);
    tp.push_back(c.tp);
    cp.push_back(c.cp);
    dp.push_back(c.dp);
    pp.push_back(c.pp);
    ep.push_back(c.ep);
    expert_tp.push_back(c.expert_tp);
    expert_dp.push_back(c.expert_dp);
  }
  // Per axis, the index of each shown rank's group; -1 for a rank in none
  // (the tied-embedding groups hold the first and last stages only).
  nlohmann::json groups = nlohmann::json::object();
  for (int a = 0; a < kNumAxes; ++a) {
    const auto& of_axis = m.groups[static_cast<size_t>(a)];
    if (of_axis.empty()) continue;
    std::vector<int64_t> index(shown, -1);
    for (size_t g = 0; g < of_axis.size(); ++g) {
      for (int64_t r : of_axis[g]) {
        if (static_cast<size_t>(r) < shown) index[static_cast<size_t>(r)] = static_cast<int64_t>(g);
      }
    }
    groups[Key(static_cast<Axis>(a))] = index;
  }
  return {{"plan", nlohmann::json::parse(RenderPlanJson(recipe, plan))},
          {"rank_groups",
           {{"world", m.world},
            {"gpus_per_node", m.gpus_per_node},
            {"shown", shown},
            {"coords",
             {{"node", node},
              {"local_gpu", local_gpu},
              {"tp", tp},
              {"cp", cp},
              {"dp", dp},
              {"pp", pp},
              {"ep", ep},
              {"expert_tp", expert_tp},
              {"expert_dp", expert_dp}}},
            {"groups", groups}}}};
}

nlohmann::json HtmlSweepPart(const SweepResult& result, const std::string& file, std::optional<int64_t> own) {
  int64_t fitting = 0;
  const std::vector<int64_t> charted = SweepChartRows(result, &fitting);
  std::set<int64_t> rows(charted.begin(), charted.end());
  rows.insert(result.top.begin(), result.top.end());
  if (own) rows.insert(*own);
  const std::vector<int64_t> only(rows.begin(), rows.end());
  nlohmann::json out = nlohmann::json::parse(SweepJson(result, file, &only));
  out["own"] = own ? nlohmann::json(*own) : nlohmann::json(nullptr);
  return out;
}

std::string RenderHtmlPage(const HtmlPage& page) {
  const nlohmann::json data = {{"command", page.command},
                               {"categories", CategoriesJson()},
                               {"reports", page.reports},
                               {"sweep", page.sweep},
                               {"check", page.check}};
  const std::string title = XmlEscape(page.title);
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
      "style-src 'unsafe-inline'\">\n<meta name=\"generator\" content=\"preflight {}\">\n<title>{}</title>\n"
      "<style>{}</style>\n</head>\n<body>\n<h1>{}</h1>\n"
      "<noscript><p>This page draws its charts with JavaScript; the data is in the preflight-data element.</p>"
      "</noscript>\n<main id=\"preflight-main\"></main>\n<div id=\"preflight-tip\"></div>\n"
      "<div id=\"preflight-status\">pending</div>\n",
      XmlEscape(page.command), title, kStyle, title);
  out += "<script type=\"application/json\" id=\"preflight-data\">";
  out += ScriptSafe(data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  out += "</script>\n<script>";
  out += kScript;
  out += "</script>\n</body>\n</html>\n";
  return out;
}

}  // namespace preflight
