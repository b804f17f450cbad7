"""How big the engine pod must be, from a profile and its memory plan: the numbers a platform
engineer would otherwise guess and forget to change when the profile changes.

    sizing = engine_sizing(load_profile("qwen2.5-7b-fp16-tp4-4090"))
    sizing.gpus, sizing.memory_bytes, sizing.startup_failure_threshold, sizing.reasons()

Everything here is arithmetic on the planner's weight bytes plus a few stated allowances; each
constant says where it comes from, and `reasons()` writes the sums into the generated file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from serving.errors import ServingError
from serving.planner.gpus import GiB, MiB
from serving.planner.profile_plan import profile_plan
from serving.profiles.model import Profile

# The base Deployment probes /health every 10 s; the threshold below counts these periods.
STARTUP_PERIOD_S = 10
# Process start before any weight is read: imports, spawning one worker per TP rank, NCCL
# set-up, tokenizer, the KV-cache memory profile. vLLM's CPU engine starts the tiny model
# eager in about a minute on 2 cores (cpu-tiny's comment); 3 min covers either at 2-3x.
START_ALLOWANCE_S = 180
# Weights come from the PVC, already downloaded by the init container (startup never waits
# for the network). 100 MiB/s is below the baseline of the usual network block volumes
# (gp3 125 MiB/s, pd-balanced and Azure premium disks more), so slow storage still passes.
READ_BYTES_S = 100 * MiB
# torch.compile of the model graph plus CUDA-graph capture for every batch size. vLLM caches
# the compiled artefacts under VLLM_CACHE_ROOT, but that is an emptyDir (/cache), so every
# pod compiles from scratch; hybrid models also build Triton kernels. enforce_eager skips it.
COMPILE_ALLOWANCE_S = 600

# Host memory (RSS) outside the weights and the KV cache. GPU: the API server process, then
# per TP rank a worker holding a CUDA context, torch, NCCL and pinned staging buffers. CPU:
# the launcher measured 1.43 GiB peak for the whole cpu-tiny engine (README), so 1 + 1.5.
GPU_SERVER_BYTES = 2 * GiB
GPU_RANK_BYTES = 4 * GiB
CPU_SERVER_BYTES = 1 * GiB
CPU_RANK_BYTES = 3 * GiB // 2

# /dev/shm. RTX 4090s have no peer-to-peer path, so NCCL's all-reduce goes through its SHM
# transport in host memory: up to NCCL_BUFFSIZE (4 MiB) x channels x peers x 2 per rank, about
# 1 GiB at TP 4. vLLM's own shared-memory message queues and torch's IPC need the first GiB
# even at TP 1 (a container's default 64 MiB is what makes vLLM crash in Docker).
SHM_BASE_BYTES = 1 * GiB
SHM_RANK_BYTES = 1 * GiB

# Millicores. GPU: a core per rank for the worker's busy CUDA launch loop and one for its
# NCCL/IO threads; two for the API server (HTTP, tokenizing, detokenizing streams) and the
# engine-core process whose scheduler loop never sleeps under load. CPU: the
# engine computes on its cores, so a rank gets one core requested and two allowed; small
# enough that the demo schedules on a 2-core node.
GPU_SERVER_MILLI = 2000
GPU_RANK_MILLI = 2000
CPU_SERVER_MILLI = 500
CPU_RANK_MILLI = 1000
# Limit = 2 x request: loading and compiling burst far above steady state, and throttling
# at the request would stretch startup past the probe for no gain.
CPU_LIMIT_FACTOR = 2

# The PVC holds the current checkpoint and, during a rollout to a new model, the next one
# (the old pod serves from its files while the new pod's init container downloads): 2x, plus
# tokenizer/config files and Hugging Face's partial downloads.
STORAGE_FACTOR = 2
STORAGE_EXTRA_BYTES = 2 * GiB


def _size(value: float) -> str:
    return f"{value / GiB:.1f} GiB" if value >= GiB else f"{math.ceil(value / MiB)} MiB"


def _ceil_gib(value: float) -> int:
    """Whole GiB, rounded up: quantities read better and the sums stay conservative."""
    return math.ceil(value / GiB) * GiB


@dataclass(frozen=True)
class EngineSizing:
    """The engine pod's resources for one profile (bytes, millicores, seconds)."""

    device: str
    tensor_parallel_size: int
    checkpoint_bytes: int  # all ranks' weights: what the pod reads from the PVC at start
    shm_bytes: int
    # What the pod's memory holds, by name (shm included: a memory-backed emptyDir is
    # charged to the pod's cgroup); the limit is their sum.
    memory_terms: tuple[tuple[str, int], ...]
    cpu_request_milli: int
    enforce_eager: bool
    pipeline_parallel_size: int = 1  # the checkpoint holds every stage's weights
    stage_ranks: int | None = None  # TP ranks of a stage, where a pod holds another count

    @property
    def gpus(self) -> int:
        """One GPU per TP rank: vLLM puts each rank on its own device."""
        return self.tensor_parallel_size if self.device == "gpu" else 0

    @property
    def memory_bytes(self) -> int:
        return _ceil_gib(sum(amount for _, amount in self.memory_terms))

    @property
    def cpu_limit_milli(self) -> int:
        return self.cpu_request_milli * CPU_LIMIT_FACTOR

    @property
    def storage_bytes(self) -> int:
        return _ceil_gib(self.checkpoint_bytes * STORAGE_FACTOR + STORAGE_EXTRA_BYTES)

    @property
    def read_seconds(self) -> int:
        return math.ceil(self.checkpoint_bytes / READ_BYTES_S)

    @property
    def compile_seconds(self) -> int:
        return 0 if self.enforce_eager else COMPILE_ALLOWANCE_S

    @property
    def startup_seconds(self) -> int:
        return START_ALLOWANCE_S + self.read_seconds + self.compile_seconds

    @property
    def startup_failure_threshold(self) -> int:
        return math.ceil(self.startup_seconds / STARTUP_PERIOD_S)

    def reasons(self) -> list[str]:
        """The sums behind the numbers, one line each, for the generated file's header."""
        compile_note = "eager, no compile" if self.enforce_eager else "compile"
        memory = " + ".join(
            f"{_size(amount)} {name}" for name, amount in self.memory_terms if amount
        )
        return [
            f"checkpoint {_size(self.checkpoint_bytes)}: the planner's weight bytes per rank "
            f"x {self.stage_ranks or self.tensor_parallel_size}"
            + (
                f" x {self.pipeline_parallel_size} stages"
                if self.pipeline_parallel_size > 1
                else ""
            ),
            f"startupProbe: {START_ALLOWANCE_S} s start + {self.read_seconds} s read at "
            f"{READ_BYTES_S // MiB} MiB/s + {self.compile_seconds} s {compile_note} "
            f"= {self.startup_failure_threshold} x {STARTUP_PERIOD_S} s",
            f"memory: {memory}, rounded up: {_size(self.memory_bytes)}",
            f"model-cache: {STORAGE_FACTOR} x checkpoint (room for the next model in a "
            f"rollout) + {_size(STORAGE_EXTRA_BYTES)} -> {_size(self.storage_bytes)}",
        ]


def _checked_plan_weights(profile: Profile) -> tuple[int, int]:
    """(one GPU's (rank's) largest weight bytes, the weight bytes of one rank of every stage)
    from the planner; a profile that does not fit is an error here too: a manifest for it
    would only crash-loop on the cluster."""
    try:
        plan = profile_plan(profile)
    except ServingError as exc:
        raise ServingError(
            f"profile {profile.name}: cannot size the engine pod from model {profile.model} ({exc})"
        ) from None
    if not plan.fits:
        reasons = "; ".join(problem.message for problem in plan.problems)
        raise ServingError(f"profile {profile.name} does not fit: {reasons}")
    stages = [stage.weight_bytes for stage in plan.stages] or [plan.weights.total]
    return max(stages), sum(stages)


def engine_sizing(profile: Profile) -> EngineSizing:
    # A pod holds one machine's ranks: all of TP on one machine, gpu_count across nodes.
    tp = profile.gpu_count if profile.nodes > 1 else profile.tensor_parallel_size
    shard, stages = _checked_plan_weights(profile)
    # replicated KV heads count once per rank: slightly over
    checkpoint = stages * profile.tensor_parallel_size
    shm = SHM_BASE_BYTES + (SHM_RANK_BYTES * tp if tp > 1 else 0)
    if profile.device == "gpu":
        offload = int(profile.cpu_offload_gb * GiB) * tp
        offload += int((profile.kv_offloading_size_gib or 0) * GiB)
        terms = (
            ("processes", GPU_SERVER_BYTES + GPU_RANK_BYTES * tp),
            # Weights pass through host memory on their way to the GPUs (safetensors' mapped
            # pages are charged to the pod's cgroup); one shard keeps loading off the limit.
            ("weight staging", shard),
            ("CPU offload", offload),
            ("shm", shm),
        )
        cpu = GPU_SERVER_MILLI + GPU_RANK_MILLI * tp
    else:
        terms = (
            ("processes", CPU_SERVER_BYTES + CPU_RANK_BYTES * tp),
            ("weights", checkpoint),  # the CPU engine computes from host memory
            # VLLM_CPU_KVCACHE_SPACE (or the bytes field) is per rank: each has its own cache.
            ("KV cache", int((profile.cpu_kv_space_gib or 0) * GiB) * tp),
            ("shm", shm),
        )
        cpu = CPU_SERVER_MILLI + CPU_RANK_MILLI * tp
    return EngineSizing(
        device=profile.device,
        tensor_parallel_size=tp,
        checkpoint_bytes=checkpoint,
        shm_bytes=shm,
        memory_terms=terms,
        cpu_request_milli=cpu,
        enforce_eager=profile.enforce_eager,
        pipeline_parallel_size=profile.pipeline_parallel_size,
        stage_ranks=profile.tensor_parallel_size,
    )
