"""`serving model`: build the models the stack ships instead of downloading.

`serving model tiny [--out DIR] [--force] [--steps N]` builds (or finds cached) the embedded
Qwen3 model and prints its directory on stdout, so `$(serving model tiny)` works in scripts.
`serving model tiny-vl [--out DIR] [--force]` does the same for the tiny Qwen2.5-VL model.
`serving model tiny-lora [--out DIR] [--force]` builds the tiny model's LoRA adapter (PEFT
layout; the profile cpu-tiny-lora serves it as team-a) and prints its directory.
`serving model tiny-embedding` and `serving model tiny-reranker` (`[--out DIR] [--force]`)
write the tiny model in Qwen3-Embedding's and Qwen3-Reranker's forms (the profiles
cpu-tiny-embedding and cpu-tiny-reranker serve them) and print their directories.
`serving model awq [--model DIR] [--out DIR] [--group-size 128] [--calibration FILE ...]`
quantizes a Qwen2/Qwen3 checkpoint to AWQ 4-bit (the tiny model when --model is not given)
and prints the output directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from serving.errors import ServingError
from serving.vllm_flags import engine_flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kinds = parser.add_subparsers(dest="model_kind", required=True, metavar="KIND")
    tiny = kinds.add_parser(
        "tiny",
        help="build the embedded tiny Qwen3 model (cached)",
        description=(
            "Train a small Qwen3 model on the shipped corpus, deterministically, and save it "
            "as a checkpoint vLLM can serve. A build with the same inputs is reused."
        ),
    )
    tiny.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="directory to build into (default: $SERVING_HOME/models/qwen3-tiny)",
    )
    tiny.add_argument("--force", action="store_true", help="rebuild even if a build is cached")
    tiny.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="training steps instead of the default (fewer: quicker, worse text; for tests)",
    )
    tiny.set_defaults(_model_run=_run_tiny)
    tiny_vl = kinds.add_parser(
        "tiny-vl",
        help="build the embedded tiny Qwen2.5-VL model (image input; cached)",
        description=(
            "Write a small Qwen2.5-VL checkpoint (text decoder, vision encoder, image "
            "preprocessor config), deterministically, that vLLM serves with image input. "
            "Its weights are random: for serving paths, not for answers."
        ),
    )
    tiny_vl.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="directory to build into (default: $SERVING_HOME/models/qwen2.5-vl-tiny)",
    )
    tiny_vl.add_argument("--force", action="store_true", help="rebuild even if a build is cached")
    tiny_vl.set_defaults(_model_run=_run_tiny_vl)
    tiny_lora = kinds.add_parser(
        "tiny-lora",
        help="build the tiny model's LoRA adapter (answers every chat with a fixed sentence)",
        description=(
            "Train rank-8 LoRA factors on the tiny Qwen3 model (built first if needed), "
            "deterministically, so that it answers every chat with a fixed sentence, and save "
            "them as a PEFT adapter vLLM loads. A build with the same inputs is reused."
        ),
    )
    tiny_lora.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="directory to build into (default: $SERVING_HOME/models/qwen3-tiny-lora)",
    )
    tiny_lora.add_argument("--force", action="store_true", help="rebuild even if a build is cached")
    tiny_lora.set_defaults(_model_run=_run_tiny_lora)
    for kind, form, run in (
        ("tiny-embedding", "Qwen3-Embedding", _run_tiny_embedding),
        ("tiny-reranker", "Qwen3-Reranker", _run_tiny_reranker),
    ):
        pooling = kinds.add_parser(
            kind,
            help=f"write the tiny Qwen3 model in {form}'s form (a pooling model; cached)",
            description=(
                f"Write the tiny Qwen3 model (built first if needed) as {form} lays out its "
                "files, deterministically, for vLLM's pooling runner. A build with the same "
                "inputs is reused."
            ),
        )
        pooling.add_argument(
            "--out",
            type=Path,
            default=None,
            metavar="DIR",
            help=f"directory to build into (default: $SERVING_HOME/models/qwen3-{kind})",
        )
        pooling.add_argument("--force", action="store_true", help="rebuild even if cached")
        pooling.set_defaults(_model_run=run)
    awq = kinds.add_parser(
        "awq",
        help="quantize a Qwen2/Qwen3 checkpoint to AWQ 4-bit (cached)",
        description=(
            "Calibrate on text, search activation-aware scales, round every decoder linear "
            "layer to 4 bits with zero points and write an AWQ (GEMM layout) checkpoint that "
            f"vLLM serves with {engine_flag('quantization')} awq. Without --model: the tiny model."
        ),
    )
    awq.add_argument(
        "--model", type=Path, default=None, metavar="DIR", help="source checkpoint directory"
    )
    awq.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="output directory (default: $SERVING_HOME/models/<source name>-awq)",
    )
    awq.add_argument(
        "--group-size",
        type=int,
        default=128,
        metavar="N",
        help="input channels per scale and zero point: 32, 64 or 128 (default 128)",
    )
    awq.add_argument(
        "--calibration",
        type=Path,
        action="append",
        default=None,
        metavar="FILE",
        help="UTF-8 text to calibrate on (repeatable; default: the shipped corpus)",
    )
    awq.add_argument(
        "--samples", type=int, default=32, metavar="N", help="calibration sequences (default 32)"
    )
    awq.add_argument(
        "--seq-len", type=int, default=256, metavar="N", help="tokens per sequence (default 256)"
    )
    awq.add_argument("--force", action="store_true", help="quantize again even if cached")
    awq.set_defaults(_model_run=_run_awq)


def run(args: argparse.Namespace) -> int:
    result: int = args._model_run(args)
    return result


def _run_tiny(args: argparse.Namespace) -> int:
    # Imported here: the builder pulls in `tokenizers` (its child process pulls in torch).
    from serving.models.tiny_model import ensure_tiny_model

    if args.steps is not None and args.steps < 1:
        raise ServingError(f"--steps {args.steps}: must be at least 1")
    path = ensure_tiny_model(args.out, force=args.force, steps=args.steps)
    print(path)
    return 0


def _run_tiny_vl(args: argparse.Namespace) -> int:
    from serving.models.tiny_vl_model import ensure_tiny_vl_model

    print(ensure_tiny_vl_model(args.out, force=args.force))
    return 0


def _run_tiny_lora(args: argparse.Namespace) -> int:
    from serving.models.tiny_lora import ensure_tiny_lora

    print(ensure_tiny_lora(args.out, force=args.force))
    return 0


def _run_tiny_embedding(args: argparse.Namespace) -> int:
    from serving.models.tiny_embedding import ensure_tiny_embedding

    print(ensure_tiny_embedding(args.out, force=args.force))
    return 0


def _run_tiny_reranker(args: argparse.Namespace) -> int:
    from serving.models.tiny_reranker import ensure_tiny_reranker

    print(ensure_tiny_reranker(args.out, force=args.force))
    return 0


def _run_awq(args: argparse.Namespace) -> int:
    from serving.models.tiny_model import ensure_tiny_model
    from serving.paths import models_dir
    from serving.quantize.awq_build import ensure_awq_model
    from serving.quantize.awq_checkpoint import GROUP_SIZES, AwqParams

    if args.group_size not in GROUP_SIZES:
        sizes = ", ".join(map(str, GROUP_SIZES))
        raise ServingError(f"--group-size {args.group_size}: must be one of {sizes}")
    for flag, value in (("--samples", args.samples), ("--seq-len", args.seq_len)):
        if value < 1:
            raise ServingError(f"{flag} {value}: must be at least 1")
    params = AwqParams(group_size=args.group_size, samples=args.samples, seq_len=args.seq_len)
    texts = None
    if args.calibration:
        texts = []
        for path in args.calibration:
            try:
                texts.append(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                raise ServingError(f"--calibration {path}: cannot read ({exc})") from exc
    if args.model is None:
        source = ensure_tiny_model()
    elif not args.model.is_dir():
        raise ServingError(f"--model {args.model}: not a directory")
    else:
        source = args.model
    out = args.out or models_dir() / f"{source.resolve().name}-awq"
    print(ensure_awq_model(source, out, params=params, texts=texts, force=args.force))
    return 0
