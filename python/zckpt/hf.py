"""zckpt.hf: the Hugging Face Trainer with DeepSpeed ZeRO checkpoints, made safe and portable.

    from zckpt.hf import ZckptCallback, prepare_resume, last_complete_checkpoint

    trainer = Trainer(..., callbacks=[ZckptCallback(consolidate="best")])
    trainer.train(resume_from_checkpoint=prepare_resume("out/checkpoint-500"))

ZckptCallback (a transformers.TrainerCallback; transformers is imported when it is first used)
    After each save, once every rank has written its files, the main process writes
    zckpt-manifest.json into the checkpoint's DeepSpeed tag folder (checkpoint-N/global_stepN/;
    into checkpoint-N/ itself when the run saved no DeepSpeed checkpoint: an FSDP run's
    checkpoint-N, whose torch Distributed Checkpoint is verified first, every zip CRC and
    chunk, so that a damaged save gets no manifest). The Trainer writes
    the manifest's folder last of all its files, so a checkpoint-N with a manifest is complete
    and one without it, in a run using the callback, is not (last_complete_checkpoint,
    is_complete); `zckpt verify checkpoint-N` checks every byte against it.
    consolidate="every" also writes checkpoint-N/consolidated/ (model.safetensors + config.json,
    equal bit for bit to DeepSpeed's zero_to_fp32; for FSDP, to torch's dcp_to_torch_save) after
    each save; consolidate="best" writes
    the best checkpoint (state.best_model_checkpoint, else the last one saved) to
    OUTPUT_DIR/best_model/ when training ends. Consolidation reads the fp32 master partitions
    from the files on the CPU: no GPU gather, and ZeRO-3 needs no
    stage3_gather_16bit_weights_on_model_save; FSDP with SHARDED_STATE_DICT needs no
    FULL_STATE_DICT gather (its checkpoint-N has no config.json: the model's config is
    written beside the weights).
    ds_engine=True also routes DeepSpeed's save_checkpoint through zckpt.ds_engine (the tag
    folder committed whole, `latest` atomically): a run killed during a save resumes from the
    previous checkpoint. ds_engine="background" writes DeepSpeed's files from a thread while
    training goes on; the engine commits them at the next optimizer step and writes the
    manifest then (the Trainer's own files of checkpoint-N are written by then), and the
    callback commits the last save when training ends.
    Every rank calls the hooks; the others wait for the main process (on a gloo group of their
    own, so a long consolidation does not run into the training group's NCCL timeout), and a
    failure raises zckpt.Error on every rank.

prepare_resume(checkpoint_dir, world_size=None, zero_stage=None) -> path
    The path to give trainer.train(resume_from_checkpoint=...): checkpoint_dir itself when the
    run's world size and ZeRO stage are the checkpoint's, else a reshard of it beside it.

last_complete_checkpoint(output_dir) / is_complete(checkpoint_dir) / write_manifest(checkpoint_dir)
checkpoint_tag_dir(checkpoint_dir) / checkpoint_dcp_dir(checkpoint_dir)

Checkpoints must be on a filesystem every rank sees (as DeepSpeed's resume needs anyway).
"""
import ctypes
import hashlib
import logging
import os
import re
import shutil
import time

from . import _native as N
from ._run import Error, run

__all__ = ["ZckptCallback", "prepare_resume", "last_complete_checkpoint", "is_complete", "write_manifest",
           "checkpoint_tag_dir", "checkpoint_dcp_dir"]

logger = logging.getLogger(__name__)

MANIFEST_NAME = "zckpt-manifest.json"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")   # transformers.trainer_utils' PREFIX_CHECKPOINT_DIR


def _b(s):
    return os.fsencode(os.fspath(s))


def _c_function(name, argtypes):
    # lib[name] is a fresh function object: these argtypes stay private to this module
    f = N.lib[name]
    f.restype = ctypes.c_int
    f.argtypes = argtypes
    return f


_manifest_write_dir = _c_function("zck_manifest_write_dir", [ctypes.c_char_p, ctypes.c_void_p])
_manifest_check_complete = _c_function("zck_manifest_check_complete", [ctypes.c_char_p, ctypes.c_int])


def _check_complete(folder):
    """Raises zckpt.Error (status "damaged") when folder is an incomplete or damaged zckpt save."""
    st, err = run(_manifest_check_complete, _b(folder), 0, progress=False, label="manifest", damaged_is_result=True)
    if st != N.OK:
        raise err


# ---- checkpoints and their manifests

def checkpoint_tag_dir(checkpoint_dir):
    """The DeepSpeed tag folder a checkpoint's `latest` names (checkpoint-N/global_stepN), or
    None when checkpoint_dir holds no DeepSpeed checkpoint."""
    latest = os.path.join(checkpoint_dir, "latest")
    if not os.path.isfile(latest):
        return None
    with open(latest) as f:
        tag = f.read().strip()
    if not tag or "/" in tag or tag in (".", ".."):
        raise Error(f"{latest}: names no tag folder ({tag!r})", "format error")
    d = os.path.join(checkpoint_dir, tag)
    if not os.path.isdir(d):
        raise Error(f"{d}: tag folder named by 'latest' does not exist", "not found")
    return d


def _manifest_dir(checkpoint_dir):
    return checkpoint_tag_dir(checkpoint_dir) or os.fspath(checkpoint_dir)


def checkpoint_dcp_dir(checkpoint_dir):
    """The torch Distributed Checkpoint folder of an FSDP save (checkpoint-N/pytorch_model_fsdp_0,
    as the Trainer and Accelerate save SHARDED_STATE_DICT; or checkpoint_dir itself when it
    holds a .metadata), or None."""
    for d in (os.path.join(checkpoint_dir, "pytorch_model_fsdp_0"), os.fspath(checkpoint_dir)):
        if os.path.isfile(os.path.join(d, ".metadata")):
            return d
    return None


def _verify_before_manifest(folder):
    """A save written by another tool (torch DCP) carries no checksum of its own: its structure
    and zip CRCs are checked before a manifest vouches for its bytes."""
    from . import verify
    rep = verify(folder, progress=False)
    if not rep.clean:
        bad = next((f for f in rep.findings if f.severity in ("damage", "unchecked")), None)
        raise Error(bad.message if bad else f"{folder}: verify says {rep.result}: no manifest written",
                    "damaged" if rep.result == "damaged" else "error")


def write_manifest(checkpoint_dir, *, overwrite=False):
    """Writes zckpt-manifest.json (every file's size and XXH3, every tensor's byte range and
    XXH3) into the checkpoint's DeepSpeed tag folder, or into checkpoint_dir when it holds
    no DeepSpeed checkpoint. Call it when every file of the checkpoint is final. Returns
    the manifest's path; an existing manifest is kept unless overwrite.
    An FSDP checkpoint (checkpoint_dcp_dir) is verified first, as `zckpt verify
    --write-manifest` does; then every file of checkpoint_dir is recorded (the Trainer's
    trainer_state.json, scheduler and RNG states too). A damaged one raises zckpt.Error
    (status "damaged") naming the file, and gets no manifest."""
    d = _manifest_dir(checkpoint_dir)
    path = os.path.join(d, MANIFEST_NAME)
    if os.path.exists(path):
        if not overwrite:
            return path
        os.unlink(path)  # else the new manifest would list the old one among the files
    if d == os.fspath(checkpoint_dir) and checkpoint_dcp_dir(checkpoint_dir):
        _verify_before_manifest(d)
    run(_manifest_write_dir, _b(d), None, progress=False, label="manifest")
    return path


def is_complete(checkpoint_dir):
    """True when the checkpoint carries a zckpt manifest and every file it lists is there
    with its size (stats only: `zckpt verify` reads the bytes)."""
    try:
        d = _manifest_dir(checkpoint_dir)
    except Error:
        return False
    if not os.path.isfile(os.path.join(d, MANIFEST_NAME)):
        return False
    try:
        _check_complete(d)
    except Error:
        return False
    return True


def last_complete_checkpoint(output_dir):
    """The newest checkpoint-N of output_dir (by N, as transformers' get_last_checkpoint)
    that is complete (is_complete), or None. A save that was interrupted, or is still being
    written, has no manifest yet and is skipped."""
    found = []
    for name in os.listdir(output_dir):
        m = _CHECKPOINT_RE.match(name)
        if m and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(m.group(1)), name))
    for _, name in sorted(found, reverse=True):
        path = os.path.join(output_dir, name)
        if is_complete(path):
            return path
    return None


# ---- ranks

def _dist():
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def _rank_and_world():
    d = _dist()
    if d is not None:
        return d.get_rank(), d.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _gloo_group(timeout_s):
    """A gloo group over all ranks for the waits (every rank must call this together)."""
    import datetime
    d = _dist()
    return d.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def _main_does(work, group):
    """Rank 0 runs work(); every rank returns its result or raises its Error (the others wait
    in a broadcast on group, a gloo group: no NCCL timeout while rank 0 works)."""
    d = _dist()
    if d is None or d.get_world_size() == 1:
        return work()
    box = [None]
    if d.get_rank() == 0:
        try:
            box[0] = ("ok", work())
        except Error as e:
            box[0] = ("error", e.message, e.status)
        except Exception as e:  # noqa: BLE001  (sent to the other ranks, re-raised here below)
            box[0] = ("error", f"{type(e).__name__}: {e}", "error")
            d.broadcast_object_list(box, src=0, group=group)
            raise
    d.broadcast_object_list(box, src=0, group=group)
    if box[0][0] == "error":
        raise Error(box[0][1], box[0][2])
    return box[0][1]


# ---- resume at another world size or ZeRO stage

def _source_id(checkpoint_dir, tag_dir):
    """Names the checkpoint's current files (name, size, mtime, inode): the same on every rank
    of a shared filesystem, different once the checkpoint is written again."""
    h = hashlib.sha256()
    for d in (checkpoint_dir, tag_dir):
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            if name == MANIFEST_NAME or not os.path.isfile(p):  # a manifest may be added later
                continue
            st = os.stat(p)
            rel = os.path.relpath(p, checkpoint_dir)
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return h.hexdigest()[:12]


def _fix_rng_files(out, from_world, to_world):
    """The Trainer reads rng_state.pth at world size 1 and rng_state_<r>.pth above it; the
    reshard kept rng_state_<r>.pth of ranks below the new world size."""
    single, rank0 = os.path.join(out, "rng_state.pth"), os.path.join(out, "rng_state_0.pth")
    if to_world == 1 and from_world > 1 and os.path.isfile(rank0) and not os.path.exists(single):
        os.rename(rank0, single)
    elif to_world > 1 and from_world == 1 and os.path.isfile(single) and not os.path.exists(rank0):
        os.rename(single, rank0)


def _reshard_beside(checkpoint_dir, out, src_world, world, stage, threads):
    from . import reshard
    parent, name = os.path.split(out)
    tmp = os.path.join(parent, f".{name}.zckpt-tmp-{os.getpid()}")
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    try:
        reshard(checkpoint_dir, tmp, world_size=world, stage=stage, threads=threads, progress=False)
        _fix_rng_files(tmp, src_world, world)
        try:
            os.rename(tmp, out)
        except OSError:
            if not os.path.isdir(out):  # else an earlier call made the same folder from the same files
                raise
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
    return out


def _inspect_layout(checkpoint_dir):
    from . import inspect
    info = inspect(checkpoint_dir)
    return int(info["world_size"]), int(info["stage"])


def _decide(checkpoint_dir, world, stage, threads, world_given=True):
    """On rank 0: the folder to resume from, resharding when needed."""
    tag_dir = checkpoint_tag_dir(checkpoint_dir)
    if tag_dir is None:
        # no DeepSpeed checkpoint: nothing zckpt changes (an FSDP save's DCP loads at any world
        # size), but an incomplete one is refused
        if checkpoint_dcp_dir(checkpoint_dir):
            _check_complete(checkpoint_dir)
        return os.fspath(checkpoint_dir)
    _check_complete(tag_dir)
    src_world, src_stage = _inspect_layout(checkpoint_dir)
    want_stage = stage or src_stage
    if src_world == world and src_stage == want_stage:
        return os.fspath(checkpoint_dir)
    if not world_given and src_world != world:
        raise Error(f"{checkpoint_dir}: saved by {src_world} ranks, and this process is not part of a distributed "
                    f"launch (no torch.distributed, no WORLD_SIZE): pass world_size={world} to reshard it for "
                    f"{world} process, or call prepare_resume on every rank under torchrun", "invalid argument")
    out = _resharded_path(checkpoint_dir, tag_dir, world, want_stage)
    if os.path.isdir(out):
        logger.info("zckpt: resuming from %s (made earlier from the same files)", out)
        return out
    t0 = time.monotonic()
    _reshard_beside(checkpoint_dir, out, src_world, world, want_stage, threads)
    logger.info("zckpt: resharded %s (ZeRO-%d, %d ranks) to %s (ZeRO-%d, %d ranks) in %.1f s", checkpoint_dir,
                src_stage, src_world, out, want_stage, world, time.monotonic() - t0)
    return out


def _resharded_path(checkpoint_dir, tag_dir, world, stage):
    # Beside the checkpoint, named outside transformers' "checkpoint-*" (its rotation and
    # get_last_checkpoint never see it), and after the source's files: a checkpoint saved
    # again under the same name gets a new folder, never a stale one.
    parent, name = os.path.split(os.path.abspath(checkpoint_dir))
    return os.path.join(parent, f"resharded-{name}-w{world}-zero{stage}-{_source_id(checkpoint_dir, tag_dir)}")


def _decision_file(checkpoint_dir, world, stage):
    parent, name = os.path.split(os.path.abspath(checkpoint_dir))
    tag_dir = checkpoint_tag_dir(checkpoint_dir)
    sid = _source_id(checkpoint_dir, tag_dir) if tag_dir else "none"
    return os.path.join(parent, f".zckpt-resume-{name}-w{world}-zero{stage or 'same'}-{sid}")


def prepare_resume(checkpoint_dir, world_size=None, zero_stage=None, *, threads=0, timeout_s=24 * 3600,
                   poll_s=0.5):
    """The path to pass to trainer.train(resume_from_checkpoint=...).

    When the run's world size (default: torch.distributed's, else $WORLD_SIZE) or ZeRO stage
    (default: the checkpoint's) differs from the checkpoint's, the checkpoint is resharded
    (zckpt.reshard: fp32 masters, Adam moments, step, param groups, scheduler, exactly) into
    a sibling folder, resharded-checkpoint-N-w<W>-zero<S>-<id>, which also gets the
    checkpoint's other files: trainer_state.json, scheduler.pt, config, tokenizer, ...
    RNG states: rank r < W keeps rng_state_<r>.pth; new ranks have none and the Trainer
    starts them with fresh RNG state (it logs that and goes on). At W=1 the Trainer reads
    rng_state.pth, which is rank 0's; from W=1, rank 0 gets it. Data order does not depend on
    these files (the sampler's seed and the step do). Else checkpoint_dir is returned as is,
    after checking that it is not an incomplete zckpt-marked save.

    Call it on every rank (under torchrun). Rank 0 does the work; the others wait: in a
    broadcast over a gloo group when torch.distributed is initialized (it is once
    TrainingArguments exist), else for a file that rank 0 writes when done (a failure on rank
    0 raises there and the launcher stops the others). The folder is made from a temporary
    one renamed into place, so a crash leaves nothing half-written, and a later call with the
    same checkpoint reuses it. Raises zckpt.Error with the library's message on failure.
    """
    checkpoint_dir = os.fspath(checkpoint_dir)
    rank, run_world = _rank_and_world()
    world = int(world_size or run_world)
    if world < 1:
        raise Error(f"world_size {world}: must be at least 1", "invalid argument")
    if zero_stage is not None and zero_stage not in (1, 2, 3):
        raise Error(f"zero_stage {zero_stage}: zckpt reshards to ZeRO stage 1, 2 or 3", "invalid argument")
    d = _dist()
    # a world size nobody gave (no argument, no process group, no WORLD_SIZE): a script run
    # by hand would silently reshard for one process; it is refused unless asked for
    world_given = world_size is not None or d is not None or "WORLD_SIZE" in os.environ
    if d is not None and d.get_world_size() > 1:
        group = _gloo_group(timeout_s)
        try:
            return _main_does(lambda: _decide(checkpoint_dir, world, zero_stage, threads), group)
        finally:
            d.destroy_process_group(group)
    if run_world <= 1:
        return _decide(checkpoint_dir, world, zero_stage, threads, world_given)
    # several processes, no process group yet: a file, named after the checkpoint's files
    # (never stale), says where rank 0 put the result
    decision = _decision_file(checkpoint_dir, world, zero_stage)
    if rank == 0:
        result = _decide(checkpoint_dir, world, zero_stage, threads)
        tmp = f"{decision}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(result)
        os.replace(tmp, decision)
        return result
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(decision):
        if time.monotonic() > deadline:
            raise Error(f"{checkpoint_dir}: rank 0 did not prepare the resume within {timeout_s} s", "limit exceeded")
        time.sleep(poll_s)
    with open(decision) as f:
        result = f.read()
    while not os.path.isdir(result):  # a decision left by an earlier run: rank 0 makes the folder again
        if time.monotonic() > deadline:
            raise Error(f"{result}: rank 0 did not prepare the resume within {timeout_s} s", "limit exceeded")
        time.sleep(poll_s)
    return result


# ---- the Trainer callback

def _callback_class():
    try:
        from transformers import TrainerCallback
    except ImportError as e:
        raise ImportError(f"zckpt.hf.ZckptCallback needs transformers: pip install 'zckpt[hf]' ({e})") from None

    class ZckptCallback(TrainerCallback):
        """Writes the zckpt manifest after each save and consolidates checkpoints on the CPU.

        consolidate: None (manifest only), "every" (each checkpoint-N into
            checkpoint-N/<consolidated_name>/), "best" (at the end of training,
            state.best_model_checkpoint, else the last checkpoint saved, into best_dir,
            default OUTPUT_DIR/best_model), or ("every", "best") for both.
        dtype, max_shard_size, exclude_frozen: as zckpt.consolidate (default: fp32 masters,
            one model.safetensors, as zero_to_fp32 gives).
        manifest: write zckpt-manifest.json after each save (default True).
        timeout_s: how long the other ranks wait for the main process at each save.
        ds_engine: True: DeepSpeed's save_checkpoint goes through zckpt.ds_engine (installed for
            every DeepSpeed engine made after this callback, so make it before trainer.train()):
            the tag folder appears whole or not at all and `latest` is written atomically, so a
            run killed during a save resumes from the previous checkpoint
            (last_complete_checkpoint). The manifest stays this callback's, written once all of
            checkpoint-N is.
            "background": the same, DeepSpeed's files written by a thread per rank while training
            goes on (zckpt.ds_engine's background=True). The engine commits the tag folder at the
            next optimizer step, the manifest with it (by then the Trainer has written the rest of
            checkpoint-N); this callback commits the last save before the Trainer's final log
            (so load_best_model_at_end finds it) and consolidates ("every") once a save is committed.
        """

        def __init__(self, consolidate=None, *, consolidated_name="consolidated", best_dir=None, dtype=None,
                     max_shard_size=None, exclude_frozen=False, manifest=True, threads=0, timeout_s=6 * 3600,
                     ds_engine=False):
            modes = set() if consolidate is None else {consolidate} if isinstance(consolidate, str) else set(consolidate)
            if not modes <= {"every", "best"}:
                raise ValueError(f"consolidate={consolidate!r}: use None, 'every', 'best' or ('every', 'best')")
            self.every, self.best = "every" in modes, "best" in modes
            self.consolidated_name = consolidated_name
            self.best_dir = best_dir
            self.options = dict(dtype=dtype, max_shard_size=max_shard_size, exclude_frozen=exclude_frozen,
                                threads=threads)
            self.manifest = manifest
            self.timeout_s = timeout_s
            self.group = None
            self.last_saved = None
            if ds_engine not in (False, True, "background"):
                raise ValueError(f"ds_engine={ds_engine!r}: use False, True or 'background'")
            self.background = ds_engine == "background"
            self.uncommitted = []  # background: checkpoints saved whose consolidation waits for the commit
            if ds_engine:
                from .ds_engine import install_default
                # synchronous: the engine's commit writes no manifest, this callback writes it after the
                # Trainer's own files (else checkpoint-N would look complete before they are there);
                # background: the commit comes after those files, and writes it
                install_default(manifest=manifest and self.background, background=self.background)

        # every rank runs these hooks; _main_does makes rank 0 work and the others wait

        def on_train_begin(self, args, state, control, **kwargs):
            d = _dist()
            if self.group is None and d is not None and d.get_world_size() > 1:
                self.group = _gloo_group(self.timeout_s)
            if self.background and args.save_total_limit == 1:
                logger.warning("zckpt: save_total_limit=1 with background saves: the Trainer deletes the previous "
                               "checkpoint before the new one is committed, so a crash in between leaves none")

        def on_save(self, args, state, control, **kwargs):
            # The Trainer's save: the DeepSpeed checkpoint (ends in a barrier), then each rank's
            # rng_state_<r>.pth (no barrier), trainer_state.json and the rotation of old
            # checkpoints on the main process, then this hook on every rank. The broadcast
            # below is the barrier that makes every rank's files final before the manifest.
            ckpt = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            self.last_saved = ckpt
            model = kwargs.get("model")
            if self.background:
                # DeepSpeed's files are still being written: the engine's commit, at the next
                # optimizer step, writes the manifest; consolidation waits for it
                if self.every:
                    self.uncommitted.append((ckpt, model))
                return
            _main_does(lambda: self._after_save(ckpt, model), self.group)

        def on_step_end(self, args, state, control, **kwargs):
            # the optimizer step just taken committed the background save before it
            if self.uncommitted and not self._pending():
                self._after_commit()

        def on_log(self, args, state, control, logs=None, **kwargs):
            # The Trainer's final log ("train_runtime") comes after the last step and before
            # load_best_model_at_end and the rotation that keeps the best checkpoint: the last
            # background save, which no optimizer step will commit, is committed here
            if self.background and logs and "train_runtime" in logs:
                self._commit_background()

        def _pending(self):
            from .ds_engine import pending_any
            return pending_any()

        def _commit_background(self):
            from .ds_engine import commit_pending_all
            commit_pending_all()  # every rank: the commit is collective
            if self.uncommitted:
                self._after_commit()

        def _after_commit(self):
            done, self.uncommitted = self.uncommitted, []
            for ckpt, model in done:
                _main_does(lambda: self._consolidate(ckpt, os.path.join(ckpt, self.consolidated_name), model)
                           if os.path.isdir(ckpt) else None, self.group)

        def on_train_end(self, args, state, control, **kwargs):
            if self.background:
                self._commit_background()
            if self.best:
                best = state.best_model_checkpoint or self.last_saved
                out = self.best_dir or os.path.join(args.output_dir, "best_model")
                model = kwargs.get("model")
                _main_does(lambda: self._consolidate(best, out, model) if best else logger.warning(
                    "zckpt: no checkpoint was saved: nothing to consolidate"), self.group)
            if self.group is not None:
                _dist().destroy_process_group(self.group)
                self.group = None

        def _after_save(self, ckpt, model=None):
            if not os.path.isdir(ckpt):
                # a hyper-parameter search saves under OUTPUT_DIR/run-<trial>/, which the hook is not told
                logger.warning("zckpt: %s not found: no manifest written for this save", ckpt)
                return
            # a manifest in checkpoint-N itself (no DeepSpeed tag folder: FSDP) covers the folder
            # consolidated/ is written into, so that one comes first; a tag folder's does not
            covers_consolidated = checkpoint_tag_dir(ckpt) is None
            if self.every and covers_consolidated:
                self._consolidate(ckpt, os.path.join(ckpt, self.consolidated_name), model)
            if self.manifest:
                t0 = time.monotonic()
                write_manifest(ckpt, overwrite=True)
                logger.info("zckpt: %s/%s written in %.1f s", _manifest_dir(ckpt), MANIFEST_NAME,
                            time.monotonic() - t0)
            if self.every and not covers_consolidated:
                self._consolidate(ckpt, os.path.join(ckpt, self.consolidated_name), model)

        def _consolidate(self, ckpt, out, model=None):
            from . import consolidate
            # an FSDP save is read from its DCP folder: checkpoint-N/consolidated is then no part of the input
            dcp = checkpoint_dcp_dir(ckpt) if checkpoint_tag_dir(ckpt) is None else None
            if checkpoint_tag_dir(ckpt) is None and dcp is None:
                logger.warning("zckpt: %s holds no DeepSpeed checkpoint or torch DCP: nothing to consolidate", ckpt)
                return None
            t0 = time.monotonic()
            consolidate(dcp or ckpt, out, overwrite=True, progress=False, **self.options)
            config = getattr(model, "config", None)
            if dcp and config is not None and not os.path.exists(os.path.join(out, "config.json")):
                # an FSDP checkpoint-N holds no config.json to take along: the model's, named after
                # its transformers class (fully_shard makes the model an FSDP<class>; FSDP1 wraps
                # it, in .module), and the folder's manifest made again to list it
                if not getattr(config, "architectures", None):
                    import copy
                    cls = next((c for m in (model, getattr(model, "module", None)) if m is not None
                                for c in type(m).__mro__ if c.__module__.startswith("transformers.")), None)
                    config = copy.deepcopy(config)
                    config.architectures = [cls.__name__] if cls else None
                config.save_pretrained(out)
                write_manifest(out, overwrite=True)
            logger.info("zckpt: consolidated %s into %s in %.1f s", ckpt, out, time.monotonic() - t0)
            return out

    ZckptCallback.__module__ = __name__
    ZckptCallback.__qualname__ = "ZckptCallback"
    return ZckptCallback


def __getattr__(name):
    # ZckptCallback subclasses transformers.TrainerCallback: made on first use, so that
    # importing zckpt.hf needs no transformers
    if name == "ZckptCallback":
        cls = _callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
