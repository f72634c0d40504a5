# WARNING: this torchtitan configuration does not run the plan preflight priced; `preflight plan --emit torchtitan` exits 1 on it unless --force is given. Reasons:
# WARNING: - model.pattern = AEMEAEMEAEMR: torchtitan has no Mamba-2 (M) or recurrent (R) model (torchtitan/models @ b5bcd76)
# WARNING: - parallel.zero = 1: torchtitan has no ZeRO-1: FSDP2 (data_parallel_shard_degree) also shards the parameters, so a rank holds less and communicates more than planned; fsdp_reshard_after_forward="never" keeps them gathered from forward to backward
# WARNING: - training.recompute = selective: torchtitan's SelectiveAC is a per-op policy (it saves matmul outputs and recomputes the rest), not the plan's per-module recompute of training.recompute_modules
# WARNING: - training.optimizer.matrices = muon: torchtitan's DistMuon needs FlexShard compute-sharding metadata per parameter (optimizer_factory_kwargs_by_name), which preflight does not emit; AdamW emitted
# torchtitan config module for nam56r-h200: 64 GPUs (8 nodes x 8 h200), from `preflight plan`
# target: pytorch/torchtitan b5bcd76 (2026-08-21); run: torchtitan.train --module <this module> --config preflight_config (NGPU=64)
# layout: tp 4 (sp) · cp 1 · pp 4 · dp 4 · ep 8 · expert_tp 1 · expert_dp 2 · zero 1 · 1f1b · 128 micro-batches of 1 · recompute selective
# stages (partitioned by megatron), layers first-last: 0-11, 12-23, 24-35, 36-47
# not emitted: tokenizer and HF assets, data loader, learning rate (default_adamw's), checkpointing
# cannot express: torchtitan has no Mamba-2 (M) or recurrent (R) model (torchtitan/models @ b5bcd76)
# cannot express: torchtitan has no ZeRO-1: FSDP2 (data_parallel_shard_degree) also shards the parameters, so a rank holds less and communicates more than planned; fsdp_reshard_after_forward="never" keeps them gathered from forward to backward
# cannot express: torchtitan's SelectiveAC is a per-op policy (it saves matmul outputs and recomputes the rest), not the plan's per-module recompute of training.recompute_modules
# cannot express: torchtitan's DistMuon needs FlexShard compute-sharding metadata per parameter (optimizer_factory_kwargs_by_name), which preflight does not emit; AdamW emitted

from torchtitan.components.optimizer import default_adamw
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.trainer import Trainer


def preflight_config() -> Trainer.Config:
    return Trainer.Config(
        model_spec=None,  # no upstream model: see the WARNING block
        optimizer=default_adamw(),
        training=TrainingConfig(
            num_tokens_per_microbatch_per_dp_rank=8192,
            num_tokens_per_train_step=4194304,
            max_context_length=8192,
            disable_cuda_graphs=True,
        ),
        parallelism=ParallelismConfig(
            data_parallel_replicate_degree=1,
            data_parallel_shard_degree=4,
            fsdp_reshard_after_forward="never",
            tensor_parallel_degree=4,
            pipeline_parallel_degree=4,
            pipeline_parallel_schedule="1F1B",
            num_pp_microbatches=128,
            expert_parallel_degree=8,
        ),
        activation_checkpoint=SelectiveAC.Config(),
        compile=CompileConfig(enable=True, components=["model"]),
    )
