"""`xlgen convert --from-tf=CKPT_PREFIX --family=xlnet|funnel|transformer_xl --config=CONFIG --out=DIR`: an original
TensorFlow release (XLNet, Funnel-Transformer, Transformer-XL) as a model directory that `xlgen.from_pretrained(DIR)`
loads (and transformers 4.34.1 too: DIR is a Hugging Face directory, `config.json` + `model.safetensors`).

The checkpoint is read without TensorFlow (`xlgen.interop.tf_checkpoint`); the family's name map (`Interop.from_tf`, in
`xlgen/models/<family>/tf_import.py`) puts each original variable into the xlgen module, and the family's Hugging
Face writer (`Interop.to_hf`) writes DIR. `--config` gives the architecture: a Hugging Face `config.json` (with
`model_type`), an xlgen config file (`configs/pretrain/xlnet_large.py`, its `model` section), or the release's own
JSON where the family reads one (XLNet `xlnet_config.json`, Funnel `net_config.json`). The tokenizer files of the
release (`spiece.model`, `vocab.txt`) are not touched: copy them next to the weights.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from xlgen import registry
from xlgen.pretrained import Interop


def family_config(family, path: str):
    """The family's config_class instance from an HF config.json, an xlgen config file or the original JSON."""
    if not path.endswith(".json"):
        from xlgen import config as config_lib

        config = config_lib.load_config(path)
        if config.model.get("family") != family.name:
            raise ValueError(f"{path}: model.family={config.model.get('family')!r}, not {family.name!r}")
        return family.model_config(config.model)
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {e.lineno}: not JSON ({e.msg})") from None
    if "model_type" in data:
        if data["model_type"] != family.record(Interop).hf_model_type:
            raise ValueError(
                f"{path}: model_type={data['model_type']!r}, expected {family.record(Interop).hf_model_type!r}"
            )
        return family.config_class.from_hf(data)
    if family.record(Interop).from_tf.original_config is None:
        raise ValueError(
            f"{path}: no model_type (not a Hugging Face config.json); family {family.name!r} has no config file "
            "of its own: pass a Hugging Face config.json or an xlgen config file"
        )
    try:
        return family.record(Interop).from_tf.original_config(data)
    except KeyError as e:
        raise ValueError(f"{path}: missing key {e.args[0]!r}") from None


def convert(ckpt_prefix: str, family_name: str, config_path: str, out_dir: str):
    """Convert; returns (out_dir, HF class name)."""
    from xlgen.interop.export import save_hf
    from xlgen.interop.tf_checkpoint import TFCheckpoint

    family = registry.get(family_name)
    interop = family.record(Interop)
    if interop is None or interop.from_tf is None or interop.to_hf is None:
        raise ValueError(f"--family={family_name}: no TensorFlow importer")
    config = family_config(family, config_path)
    ckpt = TFCheckpoint(ckpt_prefix)
    module = interop.from_tf.load(ckpt, config)
    hf_config, state_dict = interop.to_hf(module)
    return save_hf(out_dir, hf_config, state_dict, flag="--out"), hf_config["architectures"][0]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="xlgen convert",
        description="Convert an original TensorFlow checkpoint (XLNet, Funnel-Transformer, Transformer-XL) into a "
        "directory xlgen.from_pretrained loads",
    )
    p.add_argument("--from-tf", "--from_tf", dest="from_tf", required=True, help="checkpoint prefix (or its dir)")
    families = sorted(f.name for f in registry.having(Interop) if f.record(Interop).from_tf is not None)
    p.add_argument("--family", required=True, choices=families)
    p.add_argument("--config", required=True, help="HF config.json, xlgen config file, or the release's JSON")
    p.add_argument("--out", required=True, help="output directory (config.json + model.safetensors)")
    p.add_argument("--platform", default=None, help="cpu | tpu | gpu (default: autodetect)")
    args = p.parse_args(argv)
    from xlgen import platforms
    from xlgen.train import outdir

    try:  # checked before the checkpoint is read: a refused --out changes nothing
        outdir.check_export_dir(args.out, "--out")
    except outdir.OutputPathError as e:
        print(f"xlgen convert: error: {e}", file=sys.stderr)
        return 2
    platforms.setup_runtime(args.platform or platforms.default_platform(), "off")
    try:
        out, arch = convert(args.from_tf, args.family, args.config, args.out)
    except (ValueError, KeyError, FileNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"xlgen convert: error: {msg}", file=sys.stderr)
        return 2
    print(f"converted {args.from_tf} -> {out} ({arch}); load with xlgen.from_pretrained({out!r})")
    return 0
