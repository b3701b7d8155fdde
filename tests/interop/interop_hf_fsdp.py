"""interop_hf_fsdp.py LIBZCKPT [VERSION]: zckpt.hf.ZckptCallback with the real HF Trainer + FSDP on the CPU
(torchrun, gloo).

The tiny Llama of tests/fixtures/gen/make_dcp_fixtures.py trains 3 steps at W=2 under the Trainer's own FSDP
(TrainingArguments(fsdp=True, fsdp_config={"version": VERSION, "state_dict_type": "SHARDED_STATE_DICT"}), on the
CPU with that script's workaround; VERSION 2 by default, the Trainer's; 1 is FullyShardedDataParallel, the
Trainer's use_orig_params=True, as make_dcp_fsdp1_fixtures.py runs it), a checkpoint and an evaluation after each
step, with ZckptCallback(("every", "best")).
Checks:
- each checkpoint-N has zckpt-manifest.json in checkpoint-N/ (an FSDP save has no DeepSpeed tag folder), and
  zckpt.verify says clean against it without a finding (every file the Trainer wrote is listed, consolidated/
  included); is_complete / last_complete_checkpoint agree;
- checkpoint-N/consolidated/model.safetensors equals torch's own dcp_to_torch_save of
  checkpoint-N/pytorch_model_fsdp_0 (its ["model"]) bit for bit, with the model's config.json beside it (the
  Trainer writes none with a sharded state dict), and transformers' AutoModelForCausalLM loads the folder;
- best_model/ is the consolidation of state.best_model_checkpoint (greater_is_better=True on eval_loss makes it
  checkpoint-1, not the last one);
- write_manifest refuses a copy of a checkpoint with a bit flipped inside a chunk (torch's reader would take it):
  zckpt.Error naming the file, status "damaged", no manifest written.
Exit 0 when everything holds, 1 otherwise, 77 without the packages.
"""
import json
import os
import pickle
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tests", "fixtures", "gen"))
sys.path.insert(0, os.path.join(SRC, "python"))
from ds_launch import torchrun  # noqa: E402

WORLD, STEPS = 2, 3


def use_fsdp1_on_cpu():
    """make_dcp_fsdp1_fixtures.py's Trainer workaround: FSDP kept, FSDP1 given the CPU as its device."""
    import accelerate
    import transformers.trainer
    from make_dcp_fsdp1_fixtures import fsdp1_on_cpu

    class Fsdp1OnCpuAccelerator(accelerate.Accelerator):
        def __init__(self, *a, fsdp_plugin=None, **k):
            super().__init__(*a, fsdp_plugin=fsdp_plugin, **k)
            if fsdp_plugin is not None:
                fsdp1_on_cpu(self, fsdp_plugin)
    transformers.trainer.Accelerator = Fsdp1OnCpuAccelerator


def worker(out_dir, result_path, version):
    import torch
    from make_dcp_fixtures import BATCH, SEQ, VOCAB, build_model, use_fsdp_on_cpu
    from make_hf_peft_fixtures import patch_for_cpu
    import zckpt.hf as zh
    patch_for_cpu()
    fsdp_config = {"version": version, "state_dict_type": "SHARDED_STATE_DICT",
                   "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    if version == 1:
        use_fsdp1_on_cpu()
        fsdp_config["sync_module_states"] = False   # its default True is refused on the CPU
    else:
        use_fsdp_on_cpu()
    from transformers import Trainer, TrainingArguments

    class Data(torch.utils.data.Dataset):
        def __init__(self, n, seed):
            self.n, self.seed = n, seed

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            ids = torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(self.seed + i))
            return {"input_ids": ids, "labels": ids.clone()}

    args = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH, max_steps=STEPS,
        save_strategy="steps", save_steps=1, eval_strategy="steps", eval_steps=1, metric_for_best_model="eval_loss",
        greater_is_better=True, learning_rate=1e-2, weight_decay=0.1, logging_steps=1, report_to=[], seed=42,
        data_seed=42, use_cpu=False, dataloader_num_workers=0, disable_tqdm=True, fsdp=True, fsdp_config=fsdp_config)
    trainer = Trainer(model=build_model(True, "fp32"), args=args, train_dataset=Data(32, 100),
                      eval_dataset=Data(4, 900), callbacks=[zh.ZckptCallback(("every", "best"))])
    assert trainer.is_fsdp_enabled
    trainer.train()
    if torch.distributed.get_rank() == 0:
        with open(result_path, "w") as f:
            json.dump({"best_model_checkpoint": trainer.state.best_model_checkpoint,
                       "wrapped": type(trainer.model_wrapped).__name__}, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def main():
    os.environ["ZCKPT_LIBRARY"] = sys.argv[1]
    version = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    import zckpt
    import zckpt.hf as zh
    failures = []

    def fail(msg):
        failures.append(msg)
        print("FAIL", msg)

    def same_bits(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))

    def torch_model(ckpt):
        pt = os.path.join(tmp, "torch.pt")
        dcp_to_torch_save(os.path.join(ckpt, "pytorch_model_fsdp_0"), pt)
        sd = torch.load(pt, weights_only=False)["model"]
        os.unlink(pt)
        return sd

    def check_consolidated(ckpt, out):
        f = os.path.join(out, "model.safetensors")
        if not os.path.isfile(f):
            return fail(f"{f}: missing")
        ours, ref = load_file(f), torch_model(ckpt)
        if set(ours) != set(ref):
            fail(f"{f}: names differ from dcp_to_torch_save: {sorted(set(ours) ^ set(ref))}")
        for k, t in ref.items():
            if k in ours and not same_bits(ours[k], t):
                fail(f"{f}: {k} differs from dcp_to_torch_save")
        if not os.path.isfile(os.path.join(out, "config.json")):
            fail(f"{out}: no config.json")
        else:
            arch = json.load(open(os.path.join(out, "config.json"))).get("architectures")
            if arch != ["LlamaForCausalLM"]:
                fail(f"{out}/config.json: architectures {arch}, want the model's class")
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging
            logging.disable_progress_bar()
            m = AutoModelForCausalLM.from_pretrained(out)
            if not same_bits(m.model.norm.weight.detach(), ref["model.norm.weight"]):
                fail(f"{out}: transformers loads other weights")
        return ref

    keep = os.environ.get("ZCK_KEEP_TMP")
    tmp = tempfile.mkdtemp(prefix="interop_hf_fsdp.")
    try:
        run = os.path.join(tmp, "run")
        if torchrun(WORLD, __file__, ["save", run, os.path.join(tmp, "save.json"), str(version)], os.path.join(tmp, "save.log")):
            fail(f"W={WORLD} FSDP{version} training with ZckptCallback failed")
            return 1
        saved = json.load(open(os.path.join(tmp, "save.json")))
        print(f"trained {STEPS} steps at W={WORLD}, model wrapped as {saved['wrapped']}")
        want = "FullyShardedDataParallel" if version == 1 else "FSDPLlamaForCausalLM"
        if saved["wrapped"] != want:
            fail(f"FSDP{version}: the Trainer wrapped the model as {saved['wrapped']}, want {want}")
        weights = {}
        for n in range(1, STEPS + 1):
            ckpt = os.path.join(run, f"checkpoint-{n}")
            if not os.path.isfile(os.path.join(ckpt, "pytorch_model_fsdp_0", ".metadata")):
                fail(f"{ckpt}: not an FSDP SHARDED_STATE_DICT save")
                continue
            if not os.path.isfile(os.path.join(ckpt, "zckpt-manifest.json")):
                fail(f"{ckpt}/zckpt-manifest.json: missing")
                continue
            rep = zckpt.verify(ckpt)
            if not rep.clean or rep.manifest is None or rep.findings:
                fail(f"{ckpt}: verify {rep.result}, manifest {rep.manifest}: "
                     + "; ".join(x.message for x in rep.findings))
            listed = {f["path"] for f in json.load(open(os.path.join(ckpt, "zckpt-manifest.json")))["files"]}
            for f in ("trainer_state.json", "optimizer_0/.metadata", "consolidated/model.safetensors"):
                if f not in listed:
                    fail(f"{ckpt}: the manifest does not list {f}")
            if not zh.is_complete(ckpt):
                fail(f"{ckpt}: not complete")
            weights[n] = check_consolidated(ckpt, os.path.join(ckpt, "consolidated"))
        if zh.last_complete_checkpoint(run) != os.path.join(run, f"checkpoint-{STEPS}"):
            fail(f"last_complete_checkpoint: {zh.last_complete_checkpoint(run)}")
        best = saved["best_model_checkpoint"]
        if not best or os.path.basename(best) != "checkpoint-1":
            fail(f"best_model_checkpoint {best}: the test wants checkpoint-1 (the first eval loss is the greatest)")
        else:
            check_consolidated(best, os.path.join(run, "best_model"))
            last = weights.get(STEPS) or {}
            if last and all(same_bits(load_file(os.path.join(run, "best_model", "model.safetensors"))[k], t)
                            for k, t in last.items()):
                fail("best_model/ holds the last checkpoint's weights, not the best one's")
        print("manifests, consolidated/ and best_model/ = dcp_to_torch_save bit for bit")

        # a damaged save gets no manifest
        d = os.path.join(tmp, "damaged", "checkpoint-2")
        shutil.copytree(os.path.join(run, "checkpoint-2"), d, ignore=shutil.ignore_patterns("zckpt-manifest.json"))
        model_dir = os.path.join(d, "pytorch_model_fsdp_0")
        md = pickle.load(open(os.path.join(model_dir, ".metadata"), "rb"))
        info = next(v for k, v in md.storage_data.items() if k.fqn == "model.model.embed_tokens.weight")
        path = os.path.join(model_dir, info.relative_path)
        data = bytearray(open(path, "rb").read())
        item = bytes(data[info.offset:info.offset + info.length])
        t = torch.load(__import__("io").BytesIO(item))
        data[info.offset + item.index(t.contiguous().view(torch.uint8).numpy().tobytes()) + 3] ^= 0x08
        open(path, "wb").write(data)
        try:
            zh.write_manifest(d)
            fail("write_manifest accepted a damaged FSDP checkpoint")
        except zckpt.Error as e:
            if e.status != "damaged" or info.relative_path not in str(e):
                fail(f"write_manifest on a damaged FSDP checkpoint: {e.status}: {e}")
        if os.path.exists(os.path.join(d, "zckpt-manifest.json")):
            fail("a manifest was written for a damaged FSDP checkpoint")
        print("a damaged FSDP checkpoint gets no manifest")
    finally:
        if keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("PASS" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "save":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(main())
