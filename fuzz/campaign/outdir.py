"""Writing under a campaign's ``--out`` so that nothing there is ever lost: one campaign at a time
(an OS file lock), no fresh campaign over a kept one unless asked, and finding folders published
whole (filled in a temp folder beside them, synced, renamed to a name that was free): a campaign
never replaces or deletes a folder, nor anything a user put in one. A command that writes files of
fixed names (triage) replaces only its own (``OwnFiles``).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout
from pa_oracle.fuzz.campaign.shard import Shard
from pa_oracle.oracle.errors import BadInput

LOCK_FILE = ".pa-oracle.lock"


class OutDirConflict(BadInput):
    """``--out`` is held by another campaign, or holds one this run would replace: a usage
    conflict (exit 2), since the same command works with another ``--out``, later, or with
    ``--resume``/``--overwrite``."""


class FindingNotSaved(Exception):
    """A finding could not be written under ``--out`` (exit 3). The message says where, what the
    finding was, and where its case was rescued, if anywhere."""

    def __init__(self, where: Path, finding: str, cause: OSError, rescued: Path | None) -> None:
        kept = f"its case.json was written to {rescued} instead" if rescued else "its case could not be written anywhere"
        super().__init__(f"could not save a finding in {where}: {cause}\n  finding: {finding}\n  {kept}")
        self.where, self.rescued = where, rescued


def _lock_path(out_dir: Path, shard: Shard) -> Path:
    if shard.count == 1:
        return Path(out_dir) / LOCK_FILE
    return Path(out_dir) / "shards" / f".pa-oracle-shard-{shard.index}-of-{shard.count}.lock"


@contextlib.contextmanager
def campaign_lock(out_dir: Path, shard: Shard = Shard()) -> Iterator[Path]:
    """Hold ``out_dir`` for this process (a shard of a campaign holds only its own state there:
    the ``--workers`` parent holds the folder, each worker its shard). Raises ``OutDirConflict``
    if another process holds it. The lock is ``flock``: a killed campaign leaves no stale lock."""
    path = _lock_path(out_dir, shard)
    path.parent.mkdir(parents=True, exist_ok=True)
    owner = path.with_name(path.name + ".owner")
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = owner.read_text().strip() if owner.is_file() else "another process"
        what = f"shard {shard} of the campaign in {out_dir}" if shard.count > 1 else str(out_dir)
        raise OutDirConflict(
            f"{what} is in use by another campaign ({holder}; lock {path}): wait for it to end, or give another --out"
        ) from None
    try:
        started = datetime.datetime.now().isoformat(timespec="seconds")
        owner.write_text(f"pid {os.getpid()} on {socket.gethostname()} since {started}\n")
        yield path
    finally:
        lock.release()


def kept_campaign(out_dir: Path, state_file: Path, workers: int, kind: str = "campaign") -> list[Path]:
    """The files in ``out_dir`` that a fresh run would replace. One shard of a job array
    (``--shard I/N``) replaces only its own state file; a whole campaign (plain or ``--workers``)
    writes ``KIND.json`` or the shard states (and ``fuzz`` its ``summary.json``), so any of them
    there, a plain campaign's, a ``--workers`` campaign's or a file of the user's, is kept. ``kind``
    is the state's name: "campaign" (``fuzz``) or "checks" (``metamorphic``)."""
    out = Path(out_dir)
    if workers <= 1 and state_file.parent != out:
        return [state_file] if state_file.exists() else []
    names = (f"{kind}.json", "summary.json") if kind == "campaign" else (f"{kind}.json",)
    whole = [out / name for name in names if (out / name).is_file()]
    return whole + sorted((out / "shards").glob(f"{kind}-*-of-*.json"))


def refuse_replacing(kept: list[Path], out_dir: Path) -> None:
    if kept:
        names = ", ".join(str(p.relative_to(out_dir)) for p in kept[:3]) + (" ..." if len(kept) > 3 else "")
        raise OutDirConflict(
            f"{out_dir} holds a campaign ({names}): --resume continues it, --overwrite starts a new one "
            "in its place (finding folders and any other files are kept), or give another --out"
        )


class OwnFiles:
    """The files a command writes under its output folder (names relative to it; ``plots/*.png``-style patterns),
    and which of them it may replace: one it wrote there and unchanged since (``RECORD`` keeps each one's
    sha256), or one of a folder written before records were kept (``older(folder)``). Anything else there is
    a user's: ``refuse`` names it (exit 2) before the command writes a file."""

    RECORD = ".pa-oracle-written.json"

    def __init__(self, folder: Path, names: tuple[str, ...], command: str, older: Callable[[Path], bool]) -> None:
        self.folder, self.names, self.command, self.older = Path(folder), names, command, older

    def present(self) -> list[Path]:
        """The files of ``names`` in the folder now (a pattern's, sorted), links and other non-files included."""
        found: list[Path] = []
        for name in self.names:
            found += sorted(self.folder.glob(name)) if "*" in name else [self.folder / name]
        return [p for p in found if p.exists() or p.is_symlink()]

    def refuse(self) -> None:
        """``OutDirConflict`` naming every file of ``names`` in the folder that is not this command's to replace."""
        record = self._record()
        older = not record and self.older(self.folder)
        kept = [p for p in self.present() if not (p.is_file() and not p.is_symlink() and
                                                  (older or record.get(self._key(p)) == _sha256(p)))]
        if kept:
            raise OutDirConflict(f"{self.folder}: nothing written, to keep {', '.join(map(str, kept))} (not written by "
                                 f"{self.command}, or edited since it was): move them away, or give another --out")

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """``refuse``, then let the command write, and ``remember`` what is there after, whatever happens."""
        self.refuse()
        try:
            yield
        finally:
            if self.folder.is_dir():
                self.remember()

    def remember(self) -> None:
        """Record every file of ``names`` in the folder now as written by this command (call after writing them)."""
        record = {self._key(p): _sha256(p) for p in self.present() if p.is_file()}
        (self.folder / self.RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")

    def _key(self, path: Path) -> str:
        return path.relative_to(self.folder).as_posix()

    def _record(self) -> dict[str, str]:
        try:
            record = json.loads((self.folder / self.RECORD).read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in record.items() if isinstance(v, str)} if isinstance(record, dict) else {}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def publish_folder(
    parent: Path, name: str, write: Callable[[Path, Path], None], *, already_saved: Callable[[Path], bool] | None = None
) -> Path:
    """Create ``parent/name`` whole and return it: ``write(tmp, final)`` fills a temp folder in
    ``parent`` (``final`` is where it will be, for the paths a report names), which is synced and
    renamed to ``name``, or to ``name-2``, ``name-3``, ... where that is taken. A folder already
    there is never replaced; one for which ``already_saved`` says yes is returned as it is.

    A kill at any instant leaves every existing folder as it was, and at most a hidden
    ``.NAME.*.tmp`` folder of the new one, which is never the only copy of a saved finding."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    tmp: Path | None = None
    try:
        for attempt in range(1, 10_000):
            final = parent / (name if attempt == 1 else f"{name}-{attempt}")
            if final.exists() or final.is_symlink():
                if already_saved is not None and final.is_dir() and already_saved(final):
                    return final
                continue
            if tmp is None:
                tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent))
            write(tmp, final)
            _sync_tree(tmp)
            try:
                os.rename(tmp, final)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    continue  # another process took the name in between: try the next one
                raise
            tmp = None
            _fsync(parent)
            return final
        raise FileExistsError(errno.EEXIST, f"no free name for {name} in {parent}")
    finally:
        if tmp is not None:  # ours, unfinished, and not a copy of anything saved
            shutil.rmtree(tmp, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder`` (files first), so that the rename publishes
    contents that are on disk."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for item in files + dirs:
            _fsync(Path(root) / item)
    _fsync(folder)


def rescue(name: str, text: str) -> Path | None:
    """Write ``text`` to a fresh temp folder (when ``--out`` cannot take a finding); its path, or None."""
    try:
        folder = Path(tempfile.mkdtemp(prefix="pa-oracle-unsaved-finding-"))
        (folder / name).write_text(text)
        return folder / name
    except OSError as exc:
        print(f"pa-oracle: could not rescue the finding in a temp folder either: {exc}", file=sys.stderr)
        return None
