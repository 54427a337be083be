"""Paths a command will write to, checked before it writes anything (one line naming the path, never a traceback).

    check_nonempty(path, flag)      an empty `--workdir=` / `--output=` names no directory (never the current one)
    check_dir_path(path, flag)      a directory a command will create or write into: not a file, not under a file,
                                    within the filesystem's name and path limits, on a writable filesystem
    check_output_file(path, flag)   a report or figure file (`--json`, `--png`, `--out`): its directory can be
                                    written; an existing file is replaced only when it is an earlier report (JSON
                                    that is no run's or model's own file) or figure (PNG), never anything else
    os_error_line(e, flag, path)    one line for an OSError met creating or writing `path`

OutputPathError is a ValueError: the CLIs print it as `xlgen <cmd>: error: ...` and exit 2. URLs (`gs://...`) are
not checked (no local filesystem limits). `xlgen.train.outdir` builds the export and workdir guards on these.
"""

from __future__ import annotations

import errno
import os

from data_pipelines import paths


class OutputPathError(ValueError):
    """A path a command would write to cannot or must not be written (one line, names the path)."""


def _short(s: str, n: int = 60) -> str:
    return s if len(s) <= n else f"{s[: n // 2]}…{s[-n // 2 :]} ({len(s)} characters)"


def _existing_ancestor(path: str) -> str:
    p = path
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _limit(path: str, name: str, default: int) -> int:
    try:
        return int(os.pathconf(path, name))
    except (OSError, ValueError):
        return default


def check_nonempty(path, flag: str = "--workdir") -> str:
    """`path` unless it is empty (`--workdir=` names no directory; it never means the current one)."""
    if path is None or str(path).strip() == "":
        raise OutputPathError(f"{flag} is empty: give a directory path")
    return str(path)


def check_dir_path(path, flag: str = "--workdir") -> str:
    """The absolute form of `path`, a directory a command will create or write into; raises OutputPathError when
    it is empty, a file, under a file, too long for the filesystem, or on a filesystem that cannot be written."""
    check_nonempty(path, flag)
    if paths.is_remote(path):
        return str(path)
    full = os.path.abspath(os.fspath(path))
    anc = _existing_ancestor(full)
    probe = anc if os.path.isdir(anc) else os.path.dirname(anc) or "/"
    max_path = _limit(probe, "PC_PATH_MAX", 4096)
    if len(full.encode()) >= max_path:
        raise OutputPathError(
            f"{flag}={_short(full)}: the path is {len(full.encode())} bytes long, beyond the filesystem's limit "
            f"of {max_path - 1}"
        )
    max_name = _limit(probe, "PC_NAME_MAX", 255)
    for part in full.split(os.sep):
        if len(part.encode()) > max_name:
            raise OutputPathError(
                f"{flag}={_short(full)}: the name {_short(part, 40)} is {len(part.encode())} bytes long, beyond the "
                f"filesystem's limit of {max_name}"
            )
    if anc == full:
        if not os.path.isdir(full):
            raise OutputPathError(f"{flag}={full}: exists and is not a directory")
    elif not os.path.isdir(anc):
        raise OutputPathError(f"{flag}={full}: {anc} is a file, not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        ro = _read_only_fs(anc)
        raise OutputPathError(
            f"{flag}={full}: {anc} is " + ("on a read-only filesystem" if ro else "not writable (permission denied)")
        )
    return full


def _read_only_fs(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def os_error_line(e: OSError, flag: str, path) -> str:
    """One line for an OSError met while creating or writing `path` (read-only filesystem, permission, name too
    long, not a directory)."""
    where = e.filename or path
    reason = {
        errno.EROFS: "read-only filesystem",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.ENAMETOOLONG: "name too long",
        errno.ENOTDIR: "a part of the path is a file",
        errno.EEXIST: "exists",
        errno.ENOSPC: "no space left on the device",
    }.get(e.errno, e.strerror or str(e))
    return f"{flag}={path}: cannot write {where} ({reason})"


# files of runs, corpora and exports that a report or figure never replaces
RUN_FILES = (
    "config.json",
    "summary.json",
    "eval_results.json",
    "manifest.json",
    "tracking.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "io.json",
    "null_odds.json",
    "predictions.json",
    "nbest_predictions.json",
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _earlier_report(path: str) -> bool:
    import json

    name = os.path.basename(path)
    if name in RUN_FILES or name.startswith("."):
        return False
    with open(path, "rb") as f:
        head = f.read(len(PNG_SIGNATURE))
        if head == PNG_SIGNATURE:
            return name.lower().endswith(".png")
        if not name.lower().endswith(".json"):
            return False
        try:
            obj = json.loads((head + f.read()).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return False
    return isinstance(obj, dict) and "xlgen" not in obj and "model_type" not in obj


def check_output_file(path, flag: str) -> str:
    """The absolute path of a report or figure file a command will write: its directory can be created and
    written (`check_dir_path`); an existing file is replaced only when it is an earlier report (a JSON object that
    is not a run's, corpus's or model's own file) or figure (a PNG); anything else is OutputPathError."""
    check_nonempty(path, flag)
    if paths.is_remote(path):
        return str(path)
    full = os.path.abspath(os.fspath(path))
    check_dir_path(os.path.dirname(full), flag)
    if os.path.isdir(full):
        raise OutputPathError(f"{flag}={full}: is a directory; give a file path")
    if os.path.lexists(full) and not _earlier_report(full):
        raise OutputPathError(
            f"{flag}={full}: exists and is not an earlier report or figure; not replacing it (give another path)"
        )
    return full
