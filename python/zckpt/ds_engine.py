"""zckpt.ds_engine: DeepSpeed's own save_checkpoint, committed the way zckpt commits.

    import zckpt.ds_engine
    engine, *_ = deepspeed.initialize(...)
    zckpt.ds_engine.install(engine)          # the one line
    engine.save_checkpoint(save_dir)         # as before

    zckpt.ds_engine.install_default()        # or, before the engine exists (HF Trainer):
    trainer = Trainer(...)                   # every DeepSpeed engine made from now on uses it

ZckptCheckpointEngine (a deepspeed.runtime.checkpoint_engine.CheckpointEngine) wraps the
engine DeepSpeed made (TorchCheckpointEngine by default), so every file holds the bytes it
would write (torch.save, same serialization): DeepSpeed's load_checkpoint, zero_to_fp32 and
zckpt read them as before. What changes is where and when they land:
  - create(): every rank learns one staging folder beside the tag, SAVE_DIR/.TAG.zck-tmp-PID
    (PID: rank 0's); rank 0 first sweeps SAVE_DIR of such folders whose writer is dead;
  - makedirs() and save() of anything under SAVE_DIR/TAG go to the staging folder, each file
    under its own name (torch.save records it in the archive) and fsynced;
  - commit(): once every rank is there (a barrier), rank 0 writes zckpt-manifest.json into
    the staging folder (every file's size and XXH3, every tensor's byte range and XXH3:
    `zckpt verify` checks them), fsyncs it, renames it to SAVE_DIR/TAG (a tag saved again
    replaces the old folder only then), fsyncs SAVE_DIR, and writes `latest` atomically
    (temporary file, fsync, rename).
With manifest=False the commit writes no manifest: zckpt.hf.ZckptCallback(ds_engine=True)
installs the engine so, and writes the manifest itself once the Trainer has written the rest
of checkpoint-N (rng_state_<r>.pth, trainer_state.json come after DeepSpeed's commit): a
manifest there marks the whole checkpoint-N complete, not only its tag folder.
A rank killed at any point before that rename leaves SAVE_DIR/TAG as it was and `latest` on
the previous tag. DeepSpeed itself then rewrites `latest` with the same text (open "w",
write): a crash inside that rewrite can leave it empty, which zckpt's resume (and
zckpt.hf.last_complete_checkpoint) treat as no tag; DeepSpeed would not. Loads are the
wrapped engine's.

background=True (install(engine, background=True)): save() is torch.save into a file of the
same name in memory (/dev/shm: the same bytes, the archive records the name) and a writer
thread copies it into the staging folder and fsyncs it while training goes on. The engine
then tells DeepSpeed it is decoupled, so DeepSpeed calls commit() at the next optimizer step
(and writes `latest` after it), as it does for its own decoupled writer: the commit waits for
this rank's writer, then proceeds as above. One save in flight: a save before the commit of
the previous one commits it first. With the HF Trainer (zckpt.hf.ZckptCallback(
ds_engine="background")) the commit, and so the manifest, comes after the Trainer has
written the rest of checkpoint-N (its files follow save_checkpoint on every rank, before the
next step): the manifest marks the whole checkpoint-N complete, as the callback's own does;
commit_pending_all() commits the last save, after which no step comes.

Collective: every rank must use the engine (install() on every rank). Checkpoints must be on
a filesystem every rank sees, as DeepSpeed's resume needs anyway.
"""
import ctypes
import os
import shutil
import tempfile
import threading
import weakref

import torch

from . import _native as N
from ._run import run

from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

_manifest_write_dir = N.lib.zck_manifest_write_dir
_manifest_write_dir.restype = ctypes.c_int
_manifest_write_dir.argtypes = [ctypes.c_char_p, ctypes.c_void_p]


def _dist():
    d = torch.distributed
    return d if d.is_available() and d.is_initialized() else None


def _fsync_path(path, is_dir=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if is_dir else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path, text):
    tmp = f"{path}.zck-tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_path(os.path.dirname(os.path.abspath(path)), True)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return True


def _memdir():
    """A folder in memory for this process's snapshots, zckpt-ds-<pid>-*; those of processes that
    are gone (killed during a background save: /dev/shm keeps them until a reboot) are removed."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    for name in os.listdir(base):
        parts = name.split("-")
        if name.startswith("zckpt-ds-") and len(parts) > 3 and parts[2].isdigit() and not _pid_alive(int(parts[2])):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"zckpt-ds-{os.getpid()}-", dir=base)


class ZckptCheckpointEngine(CheckpointEngine):
    """DeepSpeed's checkpoint engine `inner`, its tag folder committed whole (see above)."""

    def __init__(self, inner, manifest=True, background=False):
        super().__init__(None)
        self.name = "ZckptCheckpointEngine"
        self.inner = inner
        self.manifest = manifest
        self.final = None    # SAVE_DIR/TAG of the save in progress
        self.staging = None  # where its files go until commit
        self.background = background
        self.pending = None  # background: the CheckpointCommitInfo DeepSpeed will commit
        self.writes = []     # background: this save's writer threads, each [thread, error]
        self.memdir = None   # background: where save() serializes to, in memory

    def _redirect(self, path):
        if self.final is None:
            return path
        p = os.path.abspath(path)
        if p == self.final or p.startswith(self.final + os.sep):
            return self.staging + p[len(self.final):]
        return path

    def create(self, info):
        if self.pending is not None:  # one save in flight: the previous one commits first
            self.commit_pending()
        self.final = os.path.abspath(os.path.join(info.save_dir, info.tag))
        d = _dist()
        pid = [os.getpid()]
        if d is not None:
            d.broadcast_object_list(pid, src=0)
        self.staging = os.path.join(os.path.dirname(self.final), f".{os.path.basename(self.final)}.zck-tmp-{pid[0]}")
        if d is None or d.get_rank() == 0:
            # what saves killed before their commit left beside the tags goes first (an old
            # tag moved aside comes back), as zckpt's own writers do
            from . import sweep_temporaries
            sweep_temporaries(os.path.dirname(self.final))
            if os.path.isdir(self.staging):  # a stale one of this pid
                shutil.rmtree(self.staging)
            os.makedirs(self.staging)
        if d is not None:
            d.barrier()
        if self.background:
            self.pending = info
        return self.inner.create(info)

    def makedirs(self, path, exist_ok=False):
        os.makedirs(self._redirect(path), exist_ok=True if self.final else exist_ok)

    def save(self, state_dict, path):
        # under its own name (torch.save records the file's name in the archive): the
        # staging folder is the temporary
        dst = self._redirect(path)
        if not self.background:
            self.inner.save(state_dict, dst)
            _fsync_path(dst)
            return
        # the snapshot: the same torch.save, into memory under the same name; the copy to
        # the disk and its fsync go to a thread
        if self.memdir is None:
            self.memdir = _memdir()
        mem = os.path.join(self.memdir, f"{len(self.writes)}")
        os.makedirs(mem)
        mem = os.path.join(mem, os.path.basename(dst))
        self.inner.save(state_dict, mem)
        job = [None, None]

        def write():
            try:
                self._write_file(mem, dst)
            except BaseException as e:  # reported by the commit
                job[1] = e
            finally:
                shutil.rmtree(os.path.dirname(mem), ignore_errors=True)

        job[0] = threading.Thread(target=write, name="zckpt-ds-writer", daemon=True)
        job[0].start()
        self.writes.append(job)

    def _write_file(self, mem, dst):
        """The writer thread's work for one file: its bytes from memory to the staging folder."""
        shutil.copyfile(mem, dst)
        _fsync_path(dst)

    def load(self, path, map_location=None):
        return self.inner.load(path, map_location=map_location)

    def _join_writes(self):
        error = None
        for thread, _ in self.writes:
            thread.join()
        for _, e in self.writes:
            error = error or e
        self.writes = []
        return error

    def commit(self, info):
        if self.background:
            self.pending = None
            error = self._join_writes()
            d = _dist()
            failed = torch.tensor([0 if error is None else 1])
            if d is not None:  # every rank stops at the same point when one failed
                d.all_reduce(failed, op=d.ReduceOp.MAX)
            if failed.item():  # not every rank's files are on the disk: no commit
                if d is None or d.get_rank() == 0:
                    shutil.rmtree(self.staging, ignore_errors=True)
                self.final = self.staging = None
                why = error if error is not None else "another rank's files could not be written"
                raise RuntimeError(f"zckpt.ds_engine: background save of {info.tag}: {why}") from error
        d = _dist()
        if d is not None:
            d.barrier()  # every rank's files are in the staging folder
        try:
            if d is None or d.get_rank() == 0:
                self._commit_rank0(info)
        finally:
            self.final = self.staging = None
        if d is not None:
            d.barrier()  # nobody goes on before the tag is in place
        return self.inner.commit(info)

    def _commit_rank0(self, info):
        staging, final = self.staging, self.final
        for root, _dirs, _files in os.walk(staging):  # the files were fsynced as saved
            _fsync_path(root, True)
        if self.manifest:
            run(_manifest_write_dir, staging.encode(), None, progress=False, label="manifest")
        _fsync_path(staging, True)
        old = None
        if os.path.exists(final):
            # the same tag saved again: the old folder moves aside only now, under the name
            # zckpt's sweep puts back should this process die before the next rename
            old = f"{staging}.zck-old-{os.getpid()}"
            os.replace(final, old)
        try:
            os.replace(staging, final)
        except OSError:
            if old:
                os.replace(old, final)
            raise
        _fsync_path(os.path.dirname(final), True)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        if info.save_latest:
            _write_atomic(os.path.join(info.save_dir, "latest"), info.tag)

    # background: DeepSpeed's protocol for a decoupled writer (engine.py: save_checkpoint
    # leaves the commit and `latest` to the next optimizer step)
    def is_decoupled(self):
        return self.background

    def get_commit_info(self):
        return self.pending

    def commit_pending(self):
        """Commits the save whose files are still being written, and its `latest` (what
        DeepSpeed's next optimizer step would do)."""
        info = self.pending
        if info is not None:
            self.commit(info)

    def cleanup(self):
        self.commit_pending()
        if self.memdir:
            shutil.rmtree(self.memdir, ignore_errors=True)
            self.memdir = None

    # the wrapped engine's answers
    def is_data_parallel_writer(self, dp_rank):
        return self.inner.is_data_parallel_writer(dp_rank)

    def preserves_storage_sharing(self):
        return self.inner.preserves_storage_sharing()


def install(engine, manifest=True, background=False):
    """Makes a deepspeed engine's save_checkpoint commit through zckpt (every rank);
    background: its files written by a thread, committed at the next optimizer step."""
    if not isinstance(engine.checkpoint_engine, ZckptCheckpointEngine):
        if engine.checkpoint_engine.is_decoupled():
            raise ValueError("zckpt.ds_engine: DeepSpeed's decoupled writer commits on its own; use the default writer")
        engine.checkpoint_engine = ZckptCheckpointEngine(engine.checkpoint_engine, manifest)
    ce = engine.checkpoint_engine
    if ce.pending is not None:
        ce.commit_pending()
    ce.manifest = manifest
    ce.background = background
    return ce


# the engines install_default made, for commit_pending_all (weak: an engine DeepSpeed drops goes)
_made = weakref.WeakSet()


def install_default(manifest=True, background=False):
    """Every DeepSpeed engine created after this call (deepspeed.initialize, the HF Trainer's)
    saves through ZckptCheckpointEngine: wraps the checkpoint engine DeepSpeed would make
    (not its decoupled writer, which commits on its own). Idempotent; the last call's
    manifest and background apply."""
    import deepspeed.runtime.engine as ds_engine_module
    make = ds_engine_module.create_checkpoint_engine
    if getattr(make, "_zckpt", False):
        make._zckpt_options = (manifest, background)
        return

    def create_checkpoint_engine(*args, **kwargs):
        inner = make(*args, **kwargs)
        if inner.is_decoupled():
            return inner
        engine = ZckptCheckpointEngine(inner, *create_checkpoint_engine._zckpt_options)
        _made.add(engine)
        return engine

    create_checkpoint_engine._zckpt = True
    create_checkpoint_engine._zckpt_options = (manifest, background)
    ds_engine_module.create_checkpoint_engine = create_checkpoint_engine


def commit_pending_all():
    """Commits the background saves still in flight in the engines install_default made (every
    rank: the commit is collective), as DeepSpeed's next optimizer step would. Returns how many."""
    n = 0
    for engine in list(_made):
        if engine.pending is not None:
            engine.commit_pending()
            n += 1
    return n


def pending_any():
    """Whether an engine install_default made has a background save not yet committed."""
    return any(engine.pending is not None for engine in list(_made))
