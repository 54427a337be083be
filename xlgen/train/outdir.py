"""Output directories: what a command may write into, checked before it writes anything.

    check_dir_path(path, flag)          a directory a command will create or write into: not empty, not a file,
                                        not under a file, within the filesystem's limits, writable (else
                                        OutputPathError: one line naming the path; data_pipelines/output_paths.py)
    check_export_dir(out, flag)         `xlgen export` / `convert` outputs: absent, an empty directory, or a previous
                                        export (its marker file `.xlgen-export`); anything else is refused
    write_export_dir(out, fill, flag)   `fill(tmp)` writes the files into a temporary sibling, then they move into
                                        `out` (created, or emptied of the previous export it holds)
    check_workdir_entries(path)         the files a run keeps have their kind (metrics.jsonl a file, checkpoints/ a
                                        directory, ...)
    writing_workdir(path)               the workdir lock of a writing run (`train`, `finetune`); a workdir this call
                                        found absent or empty is removed (or emptied) again when the command fails
                                        before the run started (no committed checkpoint, no metric record); a
                                        start killed before that (SIGKILL: no clean-up ran) left its marker
                                        `.xlgen-start`, and the next start clears what it wrote and starts afresh
    committed_steps(dir)                the committed checkpoint steps of an Orbax directory (digit names)

OutputPathError is a ValueError: every CLI prints it as `xlgen <cmd>: error: ...` and exits 2. URLs (`gs://...`)
are not checked (no local filesystem limits; object stores have no directories to claim).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Callable, Iterator, List

from data_pipelines import paths
from data_pipelines.output_paths import (  # noqa: F401  (the path checks, re-exported)
    OutputPathError,
    check_dir_path,
    check_nonempty,
    os_error_line,
)

EXPORT_MARKER = ".xlgen-export"
# Written by `writing_workdir` into a workdir it found absent or empty, removed when the command ends: a workdir
# holding it is a start that was killed (SIGKILL: no clean-up ran); without a started run, a half-made workdir.
START_MARKER = ".xlgen-start"
# The entries of a workdir and the kind each must have when present ("file" | "dir").
WORKDIR_ENTRIES = {
    "config.json": "file",
    "metrics.jsonl": "file",
    "summary.json": "file",
    "eval_results.json": "file",
    "checkpoints": "dir",
    "best": "dir",
    "tensorboard": "dir",
    "tokenizer": "dir",
    "cache": "dir",
}


# ----------------------------------------------------------------------------------------------------------------
# Exports (`xlgen export --to-hf/--to-onnx/--to-stablehlo`, `xlgen convert --out`)
# ----------------------------------------------------------------------------------------------------------------


def is_export_dir(path: str) -> bool:
    """A directory written by xlgen's export (it holds the marker file)."""
    return os.path.isfile(os.path.join(path, EXPORT_MARKER))


def check_export_dir(out_dir, flag: str = "--to-hf") -> str:
    """The absolute path of `out_dir` if an export may be written there: it does not exist, is an empty directory,
    or holds a previous export (the marker file `.xlgen-export`). Anything else — a workdir, a non-empty
    directory, `.`, a file — raises OutputPathError (nothing is changed)."""
    full = check_dir_path(out_dir, flag)
    if paths.is_remote(full):
        raise OutputPathError(f"{flag}={full}: exports are written to a local directory")
    if os.path.isdir(full) and os.listdir(full) and not is_export_dir(full):
        what = "an xlgen workdir" if os.path.exists(os.path.join(full, "config.json")) else "a non-empty directory"
        if os.path.exists(os.path.join(full, "checkpoints")):
            what = "an xlgen workdir"
        raise OutputPathError(
            f"{flag}={full}: is {what} that no export wrote; give a new or empty directory "
            f"(an export replaces only a previous export, marked by {EXPORT_MARKER})"
        )
    return full


def _install_export(tmp: str, out: str, parent: str, kind: str, flag: str) -> None:
    """Mark `tmp` as an export, then make it `out`: renamed into place when `out` is absent, else its files moved
    into `out` after the previous export's files moved out (`out` keeps its inode: it may be the current
    directory)."""
    with open(os.path.join(tmp, EXPORT_MARKER), "w", encoding="utf-8") as f:
        json.dump({"kind": kind, "files": sorted(os.listdir(tmp))}, f)
        f.write("\n")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp and safetensors create 0700 / 0600: a model directory is shared
    for name in os.listdir(tmp):
        if os.path.isfile(os.path.join(tmp, name)):
            os.chmod(os.path.join(tmp, name), 0o666 & ~umask)
    if not os.path.exists(out):
        os.rename(tmp, out)  # a new directory appears complete
        return
    check_export_dir(out, flag)  # still empty or an export (nothing appeared meanwhile)
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=parent)
    try:
        for name in os.listdir(out):  # the previous export (every file in it is the export's own)
            os.rename(os.path.join(out, name), os.path.join(old, name))
        for name in [EXPORT_MARKER] + sorted(n for n in os.listdir(tmp) if n != EXPORT_MARKER):
            os.rename(os.path.join(tmp, name), os.path.join(out, name))
    finally:
        shutil.rmtree(old, ignore_errors=True)


def write_export_dir(out_dir, fill: Callable[[str], None], *, flag: str = "--to-hf", kind: str = "hf") -> str:
    """Write an export: `fill(tmp)` writes its files into a temporary sibling directory; they then move into
    `out_dir` (created, or an empty directory, or one holding a previous export, whose files are removed first).
    The marker `.xlgen-export` ({"kind": kind}) makes the directory recognisable as an export. A failure changes
    nothing that existed. Returns the absolute path. The one guard of every export format."""
    out = check_export_dir(out_dir, flag)
    parent = os.path.dirname(out)
    try:
        made = paths.make_dirs(parent)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    except OSError as e:
        raise OutputPathError(os_error_line(e, flag, out)) from None
    try:
        fill(tmp)
        try:
            _install_export(tmp, out, parent, kind, flag)
        except OSError as e:
            raise OutputPathError(os_error_line(e, flag, out)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        paths.remove_empty(made)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Workdirs of writing runs
# ----------------------------------------------------------------------------------------------------------------


def committed_steps(directory: str) -> List[int]:
    """The committed checkpoint steps in an Orbax directory (entries named by their step; Orbax writes into a
    temporary name and renames on commit)."""
    try:
        return sorted(int(n) for n in os.listdir(directory) if n.isdigit())
    except (FileNotFoundError, NotADirectoryError):
        return []


def run_started(path: str) -> bool:
    """A run in `path` got far enough to keep: a committed checkpoint, or metric records of trained steps."""
    if committed_steps(os.path.join(path, "checkpoints")) or committed_steps(os.path.join(path, "best")):
        return True
    metrics = os.path.join(path, "metrics.jsonl")
    return os.path.isfile(metrics) and os.path.getsize(metrics) > 0


def check_workdir_entries(path) -> None:
    """Each file a run keeps has the kind it must have (metrics.jsonl a file, checkpoints/ a directory, ...)."""
    if paths.is_remote(path) or not os.path.isdir(path):
        return
    for name, kind in WORKDIR_ENTRIES.items():
        p = os.path.join(path, name)
        if not os.path.lexists(p):
            continue
        if kind == "file" and not os.path.isfile(p):
            raise OutputPathError(f"{p}: is a directory (or not a regular file); the run keeps a file there")
        if kind == "dir" and not os.path.isdir(p):
            raise OutputPathError(f"{p}: is a file; the run keeps a directory there")


def check_not_foreign(path: str, flag: str = "--workdir") -> None:
    """A run writes only into a new or empty directory or an xlgen workdir (its config.json, or only entries a
    run writes): a directory holding anything else (the repository, a corpus, an export, a home directory) is
    refused with OutputPathError."""
    from xlgen.train import guards

    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "config.json")):
        return  # config.json: Workdir.require_kind tells an xlgen run of the right kind from anything else
    known = set(WORKDIR_ENTRIES) | {guards.LOCK_NAME, START_MARKER}
    foreign = sorted(n for n in os.listdir(path) if n not in known)
    if foreign:
        raise OutputPathError(
            f"{flag}={path}: a non-empty directory that is not an xlgen workdir (it holds {_short(foreign[0], 40)}"
            + (f" and {len(foreign) - 1} more" if len(foreign) > 1 else "")
            + "); give a new or empty directory"
        )


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _remove_entry(p: str) -> None:
    with contextlib.suppress(OSError):  # the command's own error is the one to report
        shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)


def _clear_unfinished_start(full: str) -> bool:
    """If `full` holds the marker of a start that never started its run (killed before its first checkpoint or
    metric record: no clean-up ran), remove what such a start writes (WORKDIR_ENTRIES and the marker) and return
    True; anything else in the directory stays. A started run's leftover marker is removed (False).
    Called with the workdir lock held: the start that wrote the marker is dead."""
    marker = os.path.join(full, START_MARKER)
    if not os.path.isfile(marker):
        return False
    if run_started(full):
        _remove_entry(marker)
        return False
    for name in WORKDIR_ENTRIES:
        if os.path.lexists(os.path.join(full, name)):
            _remove_entry(os.path.join(full, name))
    _remove_entry(marker)
    return True


@contextlib.contextmanager
def writing_workdir(path, *, enabled: bool = True, flag: str = "--workdir") -> Iterator[None]:
    """Hold `path`'s workdir lock while a command writes a run into it (`guards.WorkdirLock`: a second live run
    fails at once). If the workdir was absent or empty when this call took the lock and the command fails (any
    exception, Ctrl-C included) before the run started (`run_started`), everything it wrote is removed while
    the lock is still held: the directory itself (and the parents this call created) when this call created it,
    else its entries (the directory the user made stays, empty). Only the lock holder cleans up, so a process
    that lost a race for a new workdir never removes the winner's. `enabled` False (other processes of a
    multi-process run): no lock, no cleanup.

    A start that is killed (SIGKILL, power loss) runs no clean-up: the marker START_MARKER, written into a
    workdir found absent or empty and removed when the command ends, lets the next start recognise it and, when
    the killed run had not started (`run_started`), remove what it wrote (only the names a start writes) before
    starting afresh."""
    from xlgen.train import guards

    if not enabled or paths.is_remote(path):
        with guards.WorkdirLock(str(path), enabled=enabled):
            yield
        return
    full = check_dir_path(path, flag)
    check_workdir_entries(full)
    check_not_foreign(full, flag)
    try:
        made = paths.make_dirs(full)
    except OSError as e:
        raise OutputPathError(os_error_line(e, flag, full)) from None
    lock = guards.WorkdirLock(full)
    try:
        lock.__enter__()
    except BaseException:
        paths.remove_empty(made)
        raise
    marker = os.path.join(full, START_MARKER)
    try:
        if _clear_unfinished_start(full):
            check_not_foreign(full, flag)  # what is left is someone else's
        fresh = not [n for n in os.listdir(full) if n != guards.LOCK_NAME]
        if fresh:
            with open(marker, "w", encoding="utf-8") as f:
                f.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
    except BaseException:  # the marker could not be written (a full disk): leave no directory this call made
        if made and made[-1] == full and set(os.listdir(full)) <= {guards.LOCK_NAME, START_MARKER}:
            shutil.rmtree(full, ignore_errors=True)
            paths.remove_empty(made[:-1])
        lock.__exit__(None, None, None)
        raise
    try:
        yield
    except BaseException:
        if fresh and not run_started(full):
            if made and made[-1] == full:
                shutil.rmtree(full, ignore_errors=True)
                paths.remove_empty(made[:-1])  # the parents this call made, unless another run uses them meanwhile
            else:
                for name in os.listdir(full):
                    _remove_entry(os.path.join(full, name))
        raise
    finally:
        if fresh:  # the start is over: it completed, or it failed and was cleaned up (or had started the run)
            _remove_entry(marker)
        lock.__exit__(None, None, None)
