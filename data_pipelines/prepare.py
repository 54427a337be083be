"""`xlgen prepare ...`: tokenizer training and corpus preparation (also `python -m data_pipelines.prepare ...`).

  xlgen prepare spm --input a.txt b.txt --model_prefix out/spiece [--vocab_size 32000] [--uncased]
  xlgen prepare wordpiece --input a.txt --output_dir out [--vocab_size 30522] [--cased]
  xlgen prepare vocab --level word --input train.txt --output out/vocab.json [--min_freq 3] [--max_size 267735]
  xlgen prepare corpus --train a.txt b.txt [--valid v.txt] --tokenizer spm:out/spiece.model \\
      --layout sentences --output data/xlnet [--workers 2] [--min_doc_tokens 0]
  xlgen prepare corpus --tfds=wiki40b/en[:train] | --hf=NAME[:SPLIT] [--text_field text] --tokenizer ... --output DIR
  xlgen prepare show --source data/xlnet --pipeline xlnet --step 0 --row 1 [--set seq_len=512 reuse_len=256]

`corpus` writes DIR/manifest.json, the vocabulary file and one memory-mapped `.npy` token shard (+ a sentence
parity shard for the `sentences` layout) per input file (or dataset file of a `tfds:` / `hf:` source,
`data_pipelines.dataset_sources`). Re-runs are idempotent: a shard whose source content,
tokenizer and settings are unchanged is kept. Unreadable, empty or non-UTF-8 inputs are skipped and reported
(in the output and in the manifest's `skipped`), or are errors with --strict. Every file is written to a temp
path and renamed. `--output` may be a URL (`gs://bucket/corpus`, needs `xlgen[gcs]`); the manifest records each
shard's sha256, which readers use to verify (and name) their local cached copy of a remote shard.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import os
import sys

import numpy as np

from data_pipelines import corpus as corpus_lib
from data_pipelines import dataset_sources, output_paths, paths
from data_pipelines import vocab as vocab_lib

# ----------------------------------------------------------------------------------------------------------------
# Tokenizer specs
# ----------------------------------------------------------------------------------------------------------------
_KINDS = {
    "spm": "sentencepiece",
    "sentencepiece": "sentencepiece",
    "wordpiece": "wordpiece",
    "char": "char",
    "byte": "byte",
    "word": "word",
}


def resolve_tokenizer(spec: str, train_files, output: str, args):
    """`spm:PATH`, `wordpiece:PATH`, `char|byte|word[:vocab.json]` -> a tokenizer (built from `train_files` when no
    vocabulary file is given for char/byte/word)."""
    kind, _, path = spec.partition(":")
    if kind not in _KINDS:
        raise ValueError(f"--tokenizer {spec!r}: expected spm:PATH, wordpiece:PATH, char, byte or word[:vocab.json]")
    kind = _KINDS[kind]
    if kind == "sentencepiece":
        return vocab_lib.SentencePieceTokenizer(path, uncased=args.uncased)
    if kind == "wordpiece":
        return vocab_lib.WordPieceTokenizer(path, uncased=not args.cased)
    if path:
        return vocab_lib.load_tokenizer(kind, path)

    def texts():
        for f in train_files:
            if isinstance(f, dataset_sources.DatasetPart):  # the equivalent text file, a line at a time
                yield from (line + "\n" for line in f.lines())
                continue
            try:
                yield vocab_lib.read_text(f)
            except (OSError, ValueError):
                continue  # reported by the shard pass

    return vocab_lib.SymbolVocab.build(
        kind, texts(), min_freq=args.min_freq, max_size=args.max_size, lower=args.uncased
    )


# ----------------------------------------------------------------------------------------------------------------
# Shards
# ----------------------------------------------------------------------------------------------------------------
def _save_npy(path: str, arr: np.ndarray) -> str:
    """Atomic write of `arr` as .npy (local or gs://); returns the file's sha256."""
    buf = io.BytesIO()
    np.save(buf, arr)
    data = buf.getvalue()
    paths.atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def _documents(lines):
    doc = []
    for line in lines:
        if line.strip():
            doc.append(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


class _Counted:
    """Iterates `lines`; `num_lines()` afterwards: `total` if given, else the lines of the equivalent text file
    (records joined by a blank line: the yielded lines minus the blank line after the last record)."""

    def __init__(self, lines, total=None):
        self._lines, self._total, self._n = lines, total, 0

    def __iter__(self):
        for line in self._lines:
            self._n += 1
            yield line

    def num_lines(self) -> int:
        return self._total if self._total is not None else max(self._n - 1, 0)


def _encode_file(job: dict) -> dict:
    """Worker: tokenizes one file into a shard. Returns the manifest entry, or {"skipped": reason}."""
    src = job["source"]
    if job.get("dataset"):  # a TFDS / Hugging Face dataset file, read a batch of records at a time
        lines = _Counted(dataset_sources.DatasetPart(**job["dataset"]).lines())
    else:
        try:
            text = vocab_lib.read_text(src)
        except (OSError, ValueError) as e:
            return {"source": src, "skipped": str(e)}
        lines = _Counted(text.splitlines(), text.count("\n") + (not text.endswith("\n")))
    t = job["tokenizer"]
    tok = vocab_lib.load_tokenizer(t["kind"], t["path"], **t["settings"])
    layout, use_eod, min_doc = job["layout"], job["use_eod"], job["min_doc_tokens"]
    chunks, parity, num_docs, dropped, prev = [], [], 0, 0, None
    for doc in _documents(lines):
        ids, sent, _ = corpus_lib.encode_lines(tok, doc + [""], layout, use_eod=use_eod)
        if len(ids) < max(1, min_doc):
            dropped += 1
            continue
        num_docs += 1
        chunks.append(ids)
        if sent is not None:
            if prev is not None and sent[0] == prev:  # keep parity flipping at document junctions (as the original)
                sent = ~sent
            prev = sent[-1]
            parity.append(sent)
    if not chunks:
        return {
            "source": src,
            "skipped": f"{src}: no tokens (all {dropped} documents shorter than --min_doc_tokens={min_doc})"
            if dropped
            else f"{src}: no tokens",
        }
    ids = np.concatenate(chunks)
    if ids.size and (ids.min() < 0 or ids.max() >= t["vocab_size"]):
        raise ValueError(f"{src}: token id out of range for the vocabulary")
    dtype = np.uint16 if t["vocab_size"] <= np.iinfo(np.uint16).max + 1 else np.int32
    out = job["output"]
    tokens_sha = _save_npy(paths.join(out, job["tokens"]), ids.astype(dtype))
    entry = {
        "source": src,
        "source_sha256": job["source_sha256"],
        "key": job["key"],
        "tokens": job["tokens"],
        "tokens_sha256": tokens_sha,
        "num_tokens": int(len(ids)),
        "num_documents": num_docs,
        "dropped_documents": dropped,
        "num_lines": lines.num_lines(),
    }
    if layout == "sentences":
        entry["sentences_sha256"] = _save_npy(paths.join(out, job["sentences"]), np.concatenate(parity))
        entry["sentences"] = job["sentences"]
    return entry


def _file_sha256(path: str) -> str | None:
    try:
        return vocab_lib.sha256_file(path)
    except OSError:
        return None


def _intact(out_dir, entry: dict) -> bool:
    """A local shard (and its sentence file) still has the sha256 the manifest recorded, hashed again now (a
    cached digest cannot see a changed byte that kept the file's size and mtime); remote: trusted (readers verify
    their cached copy)."""
    if paths.is_remote(out_dir):
        return True
    for kind in ("tokens", "sentences"):
        sha = entry.get(f"{kind}_sha256")
        if sha and corpus_lib.shard_info(str(out_dir.joinpath(entry[kind])), rehash=True)["sha256"] != sha:
            return False
    return True


def prepare_corpus(
    splits: dict,
    tokenizer,
    output: str,
    *,
    layout: str = "lm",
    use_eod: bool = True,
    min_doc_tokens: int = 0,
    workers: int = 1,
    strict: bool = False,
    progress: bool = True,
) -> dict:
    """Tokenizes {split: [files or `dataset_sources.DatasetPart`s]} into `output`; returns the manifest (also
    written to output/manifest.json)."""
    from tqdm import tqdm

    if layout not in ("lm", "sentences"):
        raise ValueError(f"--layout {layout!r}: expected lm or sentences")
    paths.makedirs(output)
    vocab_file = tokenizer.save(output)
    tok_entry = {
        "kind": tokenizer.kind,
        "file": vocab_file,
        "sha256": tokenizer.fingerprint(),
        "vocab_size": tokenizer.vocab_size,
        "settings": tokenizer.settings(),
    }
    settings = {"layout": layout, "use_eod": use_eod, "min_doc_tokens": min_doc_tokens}
    old = {}
    if paths.as_path(output).joinpath(corpus_lib.MANIFEST).is_file():
        try:
            prev = corpus_lib.read_manifest(output)
            old = {sh["key"]: sh for s in prev["splits"].values() for sh in s["shards"]}
        except (ValueError, KeyError):
            old = {}
    config_key = json.dumps([tok_entry["sha256"], tok_entry["settings"], settings], sort_keys=True)
    jobs, entries, skipped, reused = [], {s: [] for s in splits}, [], 0
    for split, files in splits.items():
        paths.makedirs(paths.join(output, split))
        for i, src in enumerate(files):
            part = src if isinstance(src, dataset_sources.DatasetPart) else None
            src = part.display if part else paths.display(src)
            sha = part.fingerprint() if part else _file_sha256(src)
            if sha is None:
                skipped.append({"file": src, "split": split, "reason": f"{src}: cannot read"})
                continue
            key = hashlib.sha256(f"{sha}|{config_key}".encode()).hexdigest()[:16]
            stem = part.stem if part else paths.as_path(src).stem
            name = f"{split}/{i:05d}-{stem}-{key}"
            sh = old.get(key)
            out_dir = paths.as_path(output)
            if (
                sh
                and sh["tokens"] == f"{name}.tokens.npy"
                and out_dir.joinpath(sh["tokens"]).is_file()
                and (layout == "lm" or out_dir.joinpath(sh.get("sentences", "")).is_file())
                and _intact(out_dir, sh)
            ):
                entries[split].append(sh)
                reused += 1
                continue
            jobs.append(
                (
                    split,
                    {
                        "source": src,
                        "source_sha256": sha,
                        "key": key,
                        "output": output,
                        "layout": layout,
                        "use_eod": use_eod,
                        "min_doc_tokens": min_doc_tokens,
                        "tokens": f"{name}.tokens.npy",
                        "sentences": f"{name}.sentences.npy",
                        "tokenizer": {**tok_entry, "path": paths.join(output, vocab_file)},
                        "dataset": dataclasses.asdict(part) if part else None,
                    },
                )
            )
    results = []
    if jobs:
        bar = tqdm(total=len(jobs), desc="prepare", unit="file", disable=not progress)
        if workers > 1 and len(jobs) > 1:
            # spawn, not fork: the caller may have started threads (JAX, tokenizers) that fork would copy mid-lock
            import multiprocessing

            with futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
                fs = {ex.submit(_encode_file, job): split for split, job in jobs}
                for f in futures.as_completed(fs):
                    results.append((fs[f], f.result()))
                    bar.update()
        else:
            for split, job in jobs:
                results.append((split, _encode_file(job)))
                bar.update()
        bar.close()
    for split, r in results:
        if "skipped" in r:
            skipped.append({"file": r["source"], "split": split, "reason": r["skipped"]})
        else:
            entries[split].append(r)
    if skipped and strict:
        raise ValueError("bad input files:\n  " + "\n  ".join(s["reason"] for s in skipped))
    for split in entries:
        entries[split].sort(key=lambda e: e["tokens"])
        if not entries[split]:
            raise ValueError(
                f"split {split!r}: no usable input files ("
                + "; ".join(s["reason"] for s in skipped if s["split"] == split)
                + ")"
            )
    manifest = {
        "format": corpus_lib.FORMAT,
        "layout": layout,
        "tokenizer": tok_entry,
        "settings": settings,
        "splits": {
            s: {
                "num_tokens": sum(e["num_tokens"] for e in es),
                "num_documents": sum(e["num_documents"] for e in es),
                "dropped_documents": sum(e["dropped_documents"] for e in es),
                "shards": es,
            }
            for s, es in entries.items()
        },
        "skipped": skipped,
    }
    paths.atomic_write_bytes(
        paths.join(output, corpus_lib.MANIFEST), json.dumps(manifest, indent=1, ensure_ascii=False).encode("utf-8")
    )
    manifest["report"] = {
        "written": len(results) - sum("skipped" in r for _, r in results),
        "up_to_date": reused,
        "skipped": len(skipped),
    }
    return manifest


# ----------------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------------
def _parser():
    ap = argparse.ArgumentParser(
        prog="xlgen prepare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("spm", help="train a SentencePiece model with XLNet's recipe")
    s.add_argument("--input", nargs="+", required=True)
    s.add_argument("--model_prefix", required=True, help="writes PREFIX.model and PREFIX.vocab")
    s.add_argument("--vocab_size", type=int, default=32000)
    s.add_argument("--character_coverage", type=float, default=0.99995)
    s.add_argument("--input_sentence_size", type=int, default=10_000_000)
    s.add_argument("--uncased", action="store_true")

    w = sub.add_parser("wordpiece", help="train a WordPiece vocab.txt (Funnel/BERT)")
    w.add_argument("--input", nargs="+", required=True)
    w.add_argument("--output_dir", required=True)
    w.add_argument("--vocab_size", type=int, default=30522)
    w.add_argument("--min_frequency", type=int, default=2)
    w.add_argument("--cased", action="store_true")

    v = sub.add_parser("vocab", help="build a Transformer-XL char/byte/word vocabulary (vocab.json)")
    v.add_argument("--level", choices=["char", "byte", "word"], required=True)
    v.add_argument("--input", nargs="+", required=True)
    v.add_argument("--output", required=True)
    v.add_argument("--min_freq", type=int, default=1)
    v.add_argument("--max_size", type=int, default=None)
    v.add_argument("--lower", action="store_true")

    c = sub.add_parser("corpus", help="tokenize text files into shards + manifest.json")
    c.add_argument("--train", nargs="*", default=[], help="text files (or tfds:NAME[:SPLIT] / hf:NAME[:SPLIT])")
    c.add_argument("--tfds", default="", metavar="NAME[:SPLIT]", help="a prepared TFDS dataset's split as train text")
    c.add_argument("--hf", default="", metavar="NAME[:SPLIT]", help="a local or cached Hugging Face dataset's split")
    c.add_argument("--text_field", default="text", help="--tfds / --hf: the field holding the text (one document)")
    c.add_argument("--tfds_data_dir", default="", help="--tfds: the TFDS data directory (default: TFDS's)")
    c.add_argument("--valid", nargs="*", default=[])
    c.add_argument("--test", nargs="*", default=[])
    c.add_argument("--tokenizer", required=True, help="spm:PATH | wordpiece:PATH | char | byte | word[:vocab.json]")
    c.add_argument(
        "--layout",
        choices=["lm", "sentences"],
        default="lm",
        help="lm: one stream (Transformer-XL, MLM); sentences: XLNet (line = sentence, blank = <eod>)",
    )
    c.add_argument("--output", required=True)
    c.add_argument("--workers", type=int, default=1)
    c.add_argument("--no_eod", action="store_true", help="sentences layout: drop blank lines instead of <eod>")
    c.add_argument("--min_doc_tokens", type=int, default=0, help="drop (and count) shorter documents")
    c.add_argument("--uncased", action="store_true", help="spm: lower-case; char/byte/word: lower-case")
    c.add_argument("--cased", action="store_true", help="wordpiece: keep case")
    c.add_argument("--min_freq", type=int, default=1, help="built word vocabularies: frequency cut-off")
    c.add_argument("--max_size", type=int, default=None, help="built word vocabularies: size cap")
    c.add_argument("--strict", action="store_true", help="bad input files are errors instead of skipped")
    c.add_argument("--quiet", action="store_true")
    sh = sub.add_parser("show", help="print one decoded example of a pipeline (inspect targets, segments, ...)")
    sh.add_argument("--source", default="tinyshakespeare", help="embedded name, text file or prepared directory")
    sh.add_argument("--pipeline", default="xlnet", choices=["lm", "xlnet", "mlm", "electra"])
    sh.add_argument("--split", default="train")
    sh.add_argument("--step", type=int, default=0)
    sh.add_argument("--row", type=int, default=0)
    sh.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="other config.data keys")
    return ap


def show_example(args) -> str:
    """One row of one batch, decoded by its pipeline (`describe_row`): XLNet targets in [brackets], then the
    segments; MLM masked input + labels; LM text."""
    import ast

    import data_pipelines

    cfg = data_pipelines.default_config(args.pipeline)
    cfg.source = args.source
    for kv in args.set:
        k, _, v = kv.partition("=")
        try:
            v = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            pass
        cfg[k] = v
    cfg.batch_size = max(cfg.batch_size, 2)
    p = data_pipelines.make_pipeline(cfg, split=args.split)
    b = p.batch(args.step)
    header = f"{args.pipeline} {args.split} step {args.step} row {args.row} (vocab_size {p.vocab_size})"
    return "\n".join([header, *p.describe_row(b, args.row)])


def _output_dir(args) -> str | None:
    """The directory a `prepare` command writes into (removed again if the command created it and fails)."""
    if args.cmd == "spm":
        return os.path.dirname(os.path.abspath(args.model_prefix))
    if args.cmd == "wordpiece":
        return args.output_dir
    if args.cmd == "vocab":
        return os.path.dirname(os.path.abspath(args.output))
    return getattr(args, "output", None)


def _replaceable(path: str, cmd: str) -> bool:
    """An existing file `prepare <cmd>` may replace: an earlier output of the same kind (a SymbolVocab JSON, a
    SentencePiece model and its .vocab, a WordPiece vocab.txt), never anything else."""
    try:
        if cmd == "vocab":
            return "symbols" in json.loads(open(path, encoding="utf-8").read())
        if cmd == "spm":
            import sentencepiece as spm

            model = path[: -len(".vocab")] + ".model" if path.endswith(".vocab") else path
            return spm.SentencePieceProcessor(model_file=model).vocab_size() > 0
        if cmd == "wordpiece":
            return "[UNK]" in open(path, encoding="utf-8").read().split("\n")
    except Exception:  # noqa: BLE001  (unreadable or another format: not ours to replace)
        return False
    return False


def check_outputs(args) -> None:
    """The paths a `prepare` command writes, checked before anything is written (OutputPathError): the output
    directory can be created and written; a corpus goes into a new or empty directory or a prepared corpus (its
    manifest.json), never a workdir or another non-empty directory; a tokenizer or vocabulary file replaces only
    an earlier one of its kind."""
    flag = {"spm": "--model_prefix", "wordpiece": "--output_dir"}.get(args.cmd, "--output")
    out = _output_dir(args)
    if not out or paths.is_remote(out):
        return
    if args.cmd == "corpus" and os.path.exists(out) and not os.path.isdir(out):
        raise output_paths.OutputPathError(
            f"--output {args.output}: is a file; give a directory for the shards and manifest"
        )
    output_paths.check_dir_path(out, flag)
    full = os.path.abspath(out)
    held = [f for f in ("config.json", "checkpoints", ".xlgen-export") if os.path.exists(os.path.join(full, f))]
    if held and not os.path.exists(os.path.join(full, corpus_lib.MANIFEST)):
        raise output_paths.OutputPathError(
            f"{flag}={full}: holds {held[0]} (an xlgen workdir or export), not prepared data; give another directory"
        )
    if args.cmd == "corpus" and os.path.isdir(full) and os.listdir(full):
        if not os.path.exists(os.path.join(full, corpus_lib.MANIFEST)):
            raise output_paths.OutputPathError(
                f"--output={full}: a non-empty directory that is not a prepared corpus (no {corpus_lib.MANIFEST}); "
                "give a new or empty directory"
            )
    files = {
        "vocab": lambda: [args.output],
        "spm": lambda: [args.model_prefix + ".model", args.model_prefix + ".vocab"],
        "wordpiece": lambda: [os.path.join(out, "vocab.txt")],
    }
    for f in files.get(args.cmd, list)():
        if os.path.isdir(f):
            raise output_paths.OutputPathError(f"{flag}: {os.path.abspath(f)} is a directory; give a file path")
        if os.path.lexists(f) and not _replaceable(f, args.cmd):
            raise output_paths.OutputPathError(
                f"{flag}: {os.path.abspath(f)} exists and is not an earlier `xlgen prepare {args.cmd}` output; "
                "not replacing it (give another path)"
            )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = _output_dir(args) if args.cmd != "show" else None
    try:
        if out:
            check_outputs(args)
        with paths.removed_on_failure(out) if out else contextlib.nullcontext():
            return _run(args)
    except (ValueError, FileNotFoundError) as e:  # UnicodeDecodeError (a binary vocab file) is a ValueError
        print(f"xlgen prepare: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno == errno.ENOSPC:
            print(
                f"xlgen prepare: error: no space left on the device writing {e.filename or args.output}",
                file=sys.stderr,
            )
        else:
            print(f"xlgen prepare: error: {e.filename or out}: {e.strerror or e}", file=sys.stderr)
        return 2


def _expand_sources(files, args) -> list:
    """File names as given; `tfds:` / `hf:` sources -> their `DatasetPart`s (errors name the dataset / field)."""
    out = []
    for f in files:
        if dataset_sources.is_dataset_source(f):
            out.extend(dataset_sources.expand(f, args.text_field, args.tfds_data_dir or None))
        else:
            out.append(f)
    return out


def _run(args) -> int:
    if args.cmd == "spm":
        path = vocab_lib.train_sentencepiece(
            args.input,
            args.model_prefix,
            vocab_size=args.vocab_size,
            character_coverage=args.character_coverage,
            input_sentence_size=args.input_sentence_size,
            uncased=args.uncased,
        )
        print(f"wrote {path}")
    elif args.cmd == "wordpiece":
        print(
            f"wrote {vocab_lib.train_wordpiece(args.input, args.output_dir, args.vocab_size, args.min_frequency, not args.cased)}"
        )
    elif args.cmd == "show":
        print(show_example(args))
    elif args.cmd == "vocab":
        texts = [vocab_lib.read_text(f) for f in args.input]
        v = vocab_lib.SymbolVocab.build(
            args.level, texts, min_freq=args.min_freq, max_size=args.max_size, lower=args.lower
        )
        paths.atomic_write_bytes(args.output, v.to_json().encode("utf-8"))
        print(f"wrote {args.output} ({v.vocab_size} symbols)")
    else:
        if not paths.is_remote(args.output) and os.path.exists(args.output) and not os.path.isdir(args.output):
            raise ValueError(f"--output {args.output}: is a file; give a directory for the shards and manifest")
        train = list(args.train) + [f"tfds:{args.tfds}"] * bool(args.tfds) + [f"hf:{args.hf}"] * bool(args.hf)
        if not train:
            raise ValueError(
                "prepare corpus: give the train text: --train FILE..., --tfds=NAME[:SPLIT] or --hf=NAME[:SPLIT]"
            )
        splits = {
            s: _expand_sources(files, args)
            for s, files in (("train", train), ("valid", args.valid), ("test", args.test))
        }
        splits = {s: files for s, files in splits.items() if files or s == "train"}
        tok = resolve_tokenizer(args.tokenizer, splits["train"], args.output, args)
        m = prepare_corpus(
            splits,
            tok,
            args.output,
            layout=args.layout,
            use_eod=not args.no_eod,
            min_doc_tokens=args.min_doc_tokens,
            workers=args.workers,
            strict=args.strict,
            progress=not args.quiet,
        )
        r = m["report"]
        print(
            f"{args.output}: {r['written']} shard(s) written, {r['up_to_date']} up to date, {r['skipped']} "
            f"skipped; vocab_size {tok.vocab_size}"
        )
        for s, info in m["splits"].items():
            print(
                f"  {s}: {info['num_tokens']} tokens, {info['num_documents']} documents "
                f"({info['dropped_documents']} dropped), {len(info['shards'])} shard(s)"
            )
        for s in m["skipped"]:
            print(f"  skipped: {s['reason']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
