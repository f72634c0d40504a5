# torchtitan config module for llama3-405b-h200: 16384 GPUs (2048 nodes x 8 h200), from `preflight plan`
# target: pytorch/torchtitan b5bcd76 (2026-08-21); run: torchtitan.train --module <this module> --config preflight_config (NGPU=16384)
# layout: tp 8 (sp) · cp 1 · pp 16 (vpp 2) · dp 128 · ep 1 · expert_tp 1 · expert_dp 1024 · zero 3 · interleaved · 16 micro-batches of 1 · recompute full
# stages (partitioned by megatron), layers first-last: 0-2, 3-6, 7-10, 11-14, 15-18, 19-22, 23-26, 27-30, 31-34, 35-38, 39-42, 43-46, 47-50, 51-54, 55-58, 59-62, 63-66, 67-70, 71-74, 75-78, 79-82, 83-86, 87-90, 91-94, 95-98, 99-102, 103-106, 107-110, 111-114, 115-118, 119-122, 123-125
# not emitted: tokenizer and HF assets, data loader, learning rate (default_adamw's), checkpointing
# model: torchtitan.models.llama3 flavor 405B, the recipe's architecture
# zero 3: FSDP2, parameters resharded after every forward ("always")

from torchtitan.components.optimizer import default_adamw
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.models.llama3 import model_registry
from torchtitan.trainer import Trainer


def preflight_config() -> Trainer.Config:
    return Trainer.Config(
        model_spec=model_registry("405B"),
        optimizer=default_adamw(),
        training=TrainingConfig(
            num_tokens_per_microbatch_per_dp_rank=8192,
            num_tokens_per_train_step=16777216,
            max_context_length=8192,
            disable_cuda_graphs=True,
        ),
        parallelism=ParallelismConfig(
            data_parallel_replicate_degree=1,
            data_parallel_shard_degree=128,
            fsdp_reshard_after_forward="always",
            tensor_parallel_degree=8,
            pipeline_parallel_degree=16,
            pipeline_parallel_schedule="Interleaved1F1B",
            num_pp_microbatches=16,
            module_fqns_per_model_part=[
                ["tok_embeddings", "layers.0", "layers.1", "layers.2"],
                ["layers.3", "layers.4", "layers.5", "layers.6"],
                ["layers.7", "layers.8", "layers.9", "layers.10"],
                ["layers.11", "layers.12", "layers.13", "layers.14"],
                ["layers.15", "layers.16", "layers.17", "layers.18"],
                ["layers.19", "layers.20", "layers.21", "layers.22"],
                ["layers.23", "layers.24", "layers.25", "layers.26"],
                ["layers.27", "layers.28", "layers.29", "layers.30"],
                ["layers.31", "layers.32", "layers.33", "layers.34"],
                ["layers.35", "layers.36", "layers.37", "layers.38"],
                ["layers.39", "layers.40", "layers.41", "layers.42"],
                ["layers.43", "layers.44", "layers.45", "layers.46"],
                ["layers.47", "layers.48", "layers.49", "layers.50"],
                ["layers.51", "layers.52", "layers.53", "layers.54"],
                ["layers.55", "layers.56", "layers.57", "layers.58"],
                ["layers.59", "layers.60", "layers.61", "layers.62"],
                ["layers.63", "layers.64", "layers.65", "layers.66"],
                ["layers.67", "layers.68", "layers.69", "layers.70"],
                ["layers.71", "layers.72", "layers.73", "layers.74"],
                ["layers.75", "layers.76", "layers.77", "layers.78"],
                ["layers.79", "layers.80", "layers.81", "layers.82"],
                ["layers.83", "layers.84", "layers.85", "layers.86"],
                ["layers.87", "layers.88", "layers.89", "layers.90"],
                ["layers.91", "layers.92", "layers.93", "layers.94"],
                ["layers.95", "layers.96", "layers.97", "layers.98"],
                ["layers.99", "layers.100", "layers.101", "layers.102"],
                ["layers.103", "layers.104", "layers.105", "layers.106"],
                ["layers.107", "layers.108", "layers.109", "layers.110"],
                ["layers.111", "layers.112", "layers.113", "layers.114"],
                ["layers.115", "layers.116", "layers.117", "layers.118"],
                ["layers.119", "layers.120", "layers.121", "layers.122"],
                ["layers.123", "layers.124", "layers.125", "norm", "lm_head"],
            ],
        ),
        activation_checkpoint=FullAC.Config(),
        compile=CompileConfig(enable=True, components=["model"]),
    )
