"""`xlgen export --workdir=DIR --to-hf=OUT`: an xlgen model as a Hugging Face directory (transformers 4.34.1).

OUT gets `config.json` (the HF config of the family, `architectures` naming the class), `model.safetensors`
(float32, every tensor the HF class holds, tied copies included so nothing depends on HF's tying) and the tokenizer
files. The per-family writers (`to_hf(module) -> (hf_config, state_dict)`) are the exact inverses of the HF loaders
next to them in the model packages; `xlgen.from_pretrained(OUT)` gives back the same model and
`transformers.AutoModel...from_pretrained(OUT)` the same outputs (tests/test_export.py).

    exportable                                 HF class
    Transformer-XL LM (pretraining workdir)    TransfoXLLMHeadModel
    XLNet PLM (pretraining workdir)            XLNetLMHeadModel
    XLNet finetuned: GLUE / RACE / SQuAD       XLNetForSequenceClassification / ...MultipleChoice / ...QuestionAnswering
    Funnel MLM / ELECTRA (the discriminator)   FunnelForMaskedLM / FunnelForPreTraining
    Funnel finetuned: GLUE / RACE / SQuAD 1.1  FunnelForSequenceClassification / ...MultipleChoice / ...QuestionAnswering

Not representable in HF (clear error): Funnel's SQuAD 2.0 answerability head, Funnel `mlm_transform` / `d_embed`,
the original block-1 residual of Funnel layouts with shared block-1 layers, XLNet with d_model != n_head * d_head.

Tokenizer files: SentencePiece -> `spiece.model` (XLNetTokenizer), WordPiece -> `vocab.txt` (FunnelTokenizer),
character / byte / word vocabularies -> `tokenizer.json` (PreTrainedTokenizerFast; WordLevel over characters,
bytes or whitespace-separated words), plus `tokenizer_config.json` / `special_tokens_map.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from xlgen import registry
from xlgen.models.params import flat_params  # noqa: F401  (re-exported: the writers' shared helper)
from xlgen.pretrained import Interop, by_hf_model_type

# ----------------------------------------------------------------------------------------------------------------
# The module inside a loaded model, and its family's writer (`Interop.to_hf`, `xlgen.models.<family>.hf_export`)
# ----------------------------------------------------------------------------------------------------------------


def unwrap(model):
    """The NNX module inside an `xlgen.from_pretrained` result (or the module itself)."""
    from flax import nnx

    if isinstance(model, nnx.Module):
        return model
    for attr in ("module", "model"):  # TransfoXLPretrained / HFFunnel .module, XLNetFromHF .model
        inner = getattr(model, attr, None)
        if isinstance(inner, nnx.Module):
            return inner
    raise TypeError(f"{type(model).__name__}: not an xlgen model")


def to_hf(model) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """(HF config dict, HF state dict {name: float32 array}) of an xlgen model (module or from_pretrained result)."""
    module = unwrap(model)
    family = registry.family_of(module)
    interop = family.record(Interop)
    if interop is None or interop.to_hf is None:
        raise ValueError(f"{type(module).__name__}: no Hugging Face writer for model.family={family.name!r}")
    return interop.to_hf(module)


# ----------------------------------------------------------------------------------------------------------------
# Writing a directory
# ----------------------------------------------------------------------------------------------------------------


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def save_hf(
    out_dir: str, hf_config: Dict[str, Any], state_dict: Dict[str, np.ndarray], tokenizer=None, flag: str = "--to-hf"
) -> str:
    """Write `config.json`, `model.safetensors` (and tokenizer files) as the export directory `out_dir`: a new or
    empty directory, or a previous export (`xlgen.train.outdir.write_export_dir`: staged in a temporary sibling, then
    moved in; anything else is refused with OutputPathError before anything is written)."""
    from safetensors.numpy import save_file

    from xlgen.train import outdir

    def fill(tmp: str) -> None:
        cfg = dict(hf_config)
        cfg.setdefault("torch_dtype", "float32")
        cfg.setdefault("transformers_version", "4.34.1")
        _write_json(os.path.join(tmp, "config.json"), cfg)
        arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in state_dict.items()}
        save_file(arrays, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            write_tokenizer(tokenizer, tmp, cfg.get("model_type", ""))

    return outdir.write_export_dir(out_dir, fill, flag=flag, kind="hf")


def export_model(model, out_dir: str, tokenizer=None) -> str:
    """Export an xlgen model (NNX module or `from_pretrained` result) to a HF directory; returns its path."""
    hf_config, state_dict = to_hf(model)
    return save_hf(out_dir, hf_config, state_dict, tokenizer)


# ----------------------------------------------------------------------------------------------------------------
# Tokenizer files
# ----------------------------------------------------------------------------------------------------------------


def _symbol_vocab_tokenizer_json(vocab) -> str:
    """A `tokenizers` WordLevel tokenizer over characters / bytes / words reproducing `SymbolVocab.encode`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    def text(s):
        return chr(s) if isinstance(s, int) else s

    symbols = [text(s) for s in vocab.symbols]
    if vocab.level == "byte":  # bytes >= 128 are shown as latin-1 characters: one symbol per byte
        symbols = [chr(s) if isinstance(s, int) else s for s in vocab.symbols]
    unk = symbols[vocab._unk] if vocab.special_ids.get("unk") is not None else None
    tok = Tokenizer(models.WordLevel({s: i for i, s in enumerate(symbols)}, unk_token=unk))
    if vocab.level == "word":
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.decoder = decoders.WordPiece(prefix="\x00", cleanup=False)  # joins words with spaces
    else:
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
    specials = [s for s in symbols if len(s) > 1 and s.startswith("<") and s.endswith(">")]
    if specials:
        tok.add_special_tokens(specials)
    return tok.to_str()


def write_tokenizer(tokenizer, out_dir: str, model_type: str) -> List[str]:
    """Write HF tokenizer files for an xlgen tokenizer (data_pipelines.vocab); returns the file names."""
    from data_pipelines import vocab as vocab_lib

    files = []
    if isinstance(tokenizer, vocab_lib.SentencePieceTokenizer):
        with open(os.path.join(out_dir, "spiece.model"), "wb") as f:
            f.write(tokenizer.sp.serialized_model_proto())
        cfg = {
            "tokenizer_class": "XLNetTokenizer",
            "do_lower_case": bool(tokenizer.uncased),
            "keep_accents": bool(tokenizer.keep_accents),
            "remove_space": True,
        }
        specials = {"unk_token": "<unk>", "sep_token": "<sep>", "pad_token": "<pad>", "cls_token": "<cls>"}
        specials.update({"mask_token": "<mask>", "bos_token": "<s>", "eos_token": "</s>"})
        files.append("spiece.model")
    elif isinstance(tokenizer, vocab_lib.WordPieceTokenizer):
        vocab = tokenizer.tok.get_vocab()
        with open(os.path.join(out_dir, "vocab.txt"), "w", encoding="utf-8") as f:
            f.write("".join(piece + "\n" for piece, _ in sorted(vocab.items(), key=lambda kv: kv[1])))
        wp = dict(by_hf_model_type(model_type).record(Interop).hf_wordpiece) if model_type else {}
        cfg = {"tokenizer_class": wp.pop("tokenizer_class", "BertTokenizer"), "do_lower_case": bool(tokenizer.uncased)}
        cfg["strip_accents"] = None
        specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]"}
        specials["mask_token"] = "[MASK]"
        specials.update(wp)  # the family's own tokenizer class and the special pieces it must be told
        files.append("vocab.txt")
    elif isinstance(tokenizer, vocab_lib.SymbolVocab):
        with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(_symbol_vocab_tokenizer_json(tokenizer))
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
        sym = lambda i: None if i is None else str(tokenizer.symbols[i])
        specials = {
            k: sym(tokenizer.special_ids.get(v))
            for k, v in (("unk_token", "unk"), ("eos_token", "eos"), ("pad_token", "pad"), ("sep_token", "sep"))
        }
        specials.update({"cls_token": sym(tokenizer.special_ids.get("cls"))})
        specials.update({"mask_token": sym(tokenizer.special_ids.get("mask"))})
        specials = {k: v for k, v in specials.items() if v is not None}
        files.append("tokenizer.json")
    else:
        raise ValueError(f"tokenizer {type(tokenizer).__name__}: no Hugging Face tokenizer format known")
    cfg.update(specials)
    cfg["model_max_length"] = 1000000000000000019884624838656
    _write_json(os.path.join(out_dir, "tokenizer_config.json"), cfg)
    _write_json(os.path.join(out_dir, "special_tokens_map.json"), specials)
    return files + ["tokenizer_config.json", "special_tokens_map.json"]


def workdir_tokenizer(config, workdir: str):
    """The tokenizer a workdir's model reads: the finetuning tokenizer, the one stored in the workdir
    (`xlgen.train.tokenizer_store`), or for older workdirs the one its pretraining data source defines."""
    import data_pipelines
    from xlgen import finetune
    from xlgen.train import tokenizer_store

    if finetune.is_finetune_workdir(workdir):
        return finetune.load_tokenizer(config)
    stored = tokenizer_store.load(workdir)
    return stored if stored is not None else data_pipelines.corpus_tokenizer(config.data, "train")


def export_workdir(workdir: str, out_dir: str, step: Optional[int] = None, with_tokenizer: bool = True) -> str:
    """Export the latest (or `step`) checkpoint of an xlgen workdir (pretraining or finetuning) to `out_dir`."""
    from xlgen.train.workdir_model import restore_params

    config, program, params, _ = restore_params(workdir, step)
    from xlgen.finetune.peft import lora_rank, merged_model

    # a LoRA finetune: the adapters folded into the weights, so transformers loads a plain model
    module = merged_model(config, program, params) if lora_rank(config) else program.make_model(params, train=False)
    if type(module).__name__ == "FunnelElectra":  # the discriminator is the model users finetune
        module = module.discriminator
    tokenizer = workdir_tokenizer(config, workdir) if with_tokenizer else None
    return export_model(module, out_dir, tokenizer)


def _pretrained_with_bi_data(workdir: str) -> bool:
    from xlgen.train.workdir import Workdir

    config = Workdir(workdir).read_config()
    return bool(config is not None and config.model.get("bi_data"))


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="xlgen export",
        description="Export an xlgen workdir's model to a Hugging Face directory, ONNX or StableHLO (jax.export)",
    )
    p.add_argument("--workdir", required=True, help="xlgen workdir (pretraining or finetuning)")
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-hf", "--to_hf", dest="to_hf", help="output directory (config.json, ...)")
    to.add_argument("--to-onnx", "--to_onnx", dest="to_onnx", help="output directory (model.onnx, io.json, ...)")
    to.add_argument(
        "--to-stablehlo", "--to_stablehlo", dest="to_stablehlo", help="output directory (model.stablehlo, io.json)"
    )
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer files")
    p.add_argument("--platform", default=None, help="cpu | tpu | gpu (default: autodetect)")
    args = p.parse_args(argv)
    from xlgen import platforms
    from xlgen.train import outdir

    fmt, out_dir = next(
        (f, d)
        for f, d in (("hf", args.to_hf), ("onnx", args.to_onnx), ("stablehlo", args.to_stablehlo))
        if d is not None
    )
    try:  # the output directory is checked before the model is read (a refusal changes nothing)
        outdir.check_export_dir(out_dir, f"--to-{fmt}")
        if not args.workdir:
            raise outdir.OutputPathError("--workdir is empty: give the run directory to export")
        if fmt != "hf":
            from xlgen import deploy

            deploy.run_kind(args.workdir)  # a run with nothing deployable: refused before anything is read
    except (outdir.OutputPathError, ValueError, FileNotFoundError) as e:
        print(f"xlgen export: error: {e}", file=sys.stderr)
        return 2
    platforms.setup_runtime(args.platform or platforms.default_platform(), "off")
    if fmt != "hf":
        return _export_deployed(args.workdir, out_dir, fmt, args.step, not args.no_tokenizer)
    try:
        out = export_workdir(args.workdir, args.to_hf, args.step, with_tokenizer=not args.no_tokenizer)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"xlgen export: error: {e}", file=sys.stderr)
        return 2
    with open(os.path.join(out, "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    print(f"exported {args.workdir} -> {out} ({arch}); load with transformers.AutoModel / {arch}.from_pretrained")
    if arch.startswith("XLNet") and _pretrained_with_bi_data(args.workdir):
        print("note: bi_data (pretraining's forward/backward batch halves) is off in the exported config.json")
    return 0


def export_deployed(workdir: str, out_dir: str, fmt: str, step: Optional[int] = None, with_tokenizer: bool = True):
    """`--to-onnx` / `--to-stablehlo` of a workdir (`xlgen.deploy.export_workdir`) with the tokenizer files of
    `--to-hf`; returns (out path, io description)."""
    from xlgen import deploy

    def tokenizer_files(config, directory: str, model_type: str) -> List[str]:
        return write_tokenizer(workdir_tokenizer(config, workdir), directory, model_type)

    return deploy.export_workdir(workdir, out_dir, fmt, step, tokenizer_files if with_tokenizer else None)


def _export_deployed(workdir: str, out_dir: str, fmt: str, step: Optional[int], with_tokenizer: bool) -> int:
    from xlgen import deploy

    try:
        out, desc = export_deployed(workdir, out_dir, fmt, step, with_tokenizer)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"xlgen export: error: {e}", file=sys.stderr)
        return 2
    axes = ", ".join(f"{a} {v}" for a, v in desc["axes"].items())
    print(f"exported {workdir} -> {out}/{deploy.FORMATS[fmt]} ({desc['family']} {desc['kind']}; {axes}); see io.json")
    return 0
