"""`python -m jrl.merge`: checkpoints of a real tiny PPO run (LoRA actor, critic) and of a sharded
plain actor become Hugging Face folders that transformers loads with the same outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import optax
import pytest
from helpers import tiny_llama
from safetensors.numpy import load_file, save_file

from jrl import merge
from jrl.assets import prepare_for
from jrl.models import init_random
from jrl.parallel import make_mesh
from jrl.runspec import load_config
from jrl.trainer.io.checkpoint import CheckpointManager, RoleSnapshot
from jrl.trainer.io.checksums import file_digest, sealed
from jrl.trainer.ppo.trainer import PPOTrainer
from jrl.trainer.update.learner import Learner

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PLAIN = tiny_llama(vocab_size=96, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def ppo(tmp_path_factory):
    """One PPO step with a LoRA actor and a critic, saved; the trained models as references."""
    root = tmp_path_factory.mktemp("ppo")
    config, _ = load_config(
        [
            "--config=configs/gsm8k_ppo.py:tiny",
            "trainer.total_training_steps=1",
            "trainer.save_freq=1",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "actor_rollout_ref.model.lora_rank=4",
            "actor_rollout_ref.model.lora_alpha=8",
            f"trainer.default_local_dir={root}",
        ]
    )
    prepare_for(config)
    trainer = PPOTrainer.from_config(config)
    trainer.fit()
    return {
        "step": root / "global_step_1",
        "actor": trainer.actor.learner.model(),
        "critic": trainer.critic.learner.model(),
        "base": Path(config.actor_rollout_ref.model.path),
    }


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A random llama actor without LoRA, FSDP-sharded over 8 devices, saved (model item only)."""
    root = tmp_path_factory.mktemp("plain")
    state = Learner.create(init_random(PLAIN, seed=5), optax.sgd(0.1), make_mesh(8))
    manager = CheckpointManager(root)
    manager.save(3, {"actor": RoleSnapshot(state, ["model"], {})})
    manager.close()
    return {"step": root / "global_step_3", "actor": state.model()}


def _ids(vocab: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, vocab, size=(3, 10), dtype=np.int32)


def _hf_out(cls, folder: Path, ids: np.ndarray) -> np.ndarray:
    model = cls.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long)).logits.numpy()


def test_plain_actor_matches_transformers(plain, tmp_path, capsys):
    out = tmp_path / "hf"
    local = plain["step"] / "actor"
    # the subcommand may be omitted; verl's --backend fsdp means the same, and its other
    # flags are accepted (what they say is read from the checkpoint)
    args = ["--backend", "fsdp", "--local_dir", str(local), "--target_dir", str(out)]
    verl_flags = ["--tie-word-embedding", "--use_cpu_initialization", "--private"]
    assert merge.main([*args, *verl_flags]) == 0
    assert "restoring" in capsys.readouterr().out
    assert not (out / "tokenizer.json").exists()  # the checkpoint holds no tokenizer
    ids = _ids(PLAIN.vocab_size)
    theirs = _hf_out(transformers.AutoModelForCausalLM, out, ids)
    np.testing.assert_allclose(theirs, np.asarray(plain["actor"](ids)), atol=1e-5, rtol=1e-5)


def test_lora_actor_merged_matches_trained_model(ppo, tmp_path):
    out = merge.merge_checkpoint(ppo["step"] / "actor", tmp_path / "hf")
    trained = ppo["actor"]
    assert np.abs(np.asarray(trained.model.layers[0].self_attn.q_proj.lora_b[...])).max() > 0
    ids = _ids(trained.config.vocab_size)
    theirs = _hf_out(transformers.AutoModelForCausalLM, out, ids)
    np.testing.assert_allclose(theirs, np.asarray(trained(ids)), atol=1e-5, rtol=1e-5)

    merged = load_file(out / "model.safetensors")
    base = load_file(ppo["base"] / "model.safetensors")
    assert merged.keys() == base.keys()  # plain HF names, no adapter tensors
    name = "model.layers.0.self_attn.q_proj.weight"
    assert np.abs(merged[name] - base[name]).max() > 1e-6
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tokenizer("12 apples").input_ids


def test_critic_merges_to_token_classification(ppo, tmp_path):
    out = merge.merge_checkpoint(ppo["step"] / "critic", tmp_path / "hf")
    critic = ppo["critic"]
    ids = _ids(critic.config.vocab_size)
    theirs = _hf_out(transformers.AutoModelForTokenClassification, out, ids)[..., 0]
    np.testing.assert_allclose(theirs, np.asarray(critic(ids)), atol=1e-5, rtol=1e-5)


def test_test_subcommand_reports_a_changed_tensor(plain, tmp_path, capsys):
    local = str(plain["step"] / "actor")
    reference = merge.merge_checkpoint(local, tmp_path / "ref")
    assert merge.main(["test", "--local_dir", local, "--test_hf_dir", str(reference)]) == 0
    total = len(load_file(reference / "model.safetensors"))
    assert f"all {total} tensors match" in capsys.readouterr().out

    tensors = load_file(reference / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1e-3
    save_file(tensors, reference / "model.safetensors")
    assert merge.main(["test", "--local_dir", local, "--test_hf_dir", str(reference)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH model.norm.weight: values differ" in out
    assert "1 difference(s)" in out


def test_help_prints_usage(capsys):
    assert merge.main(["--help"]) == 0
    assert "--local_dir" in capsys.readouterr().out


def test_an_upload_is_refused_before_anything_is_written(plain, tmp_path, capsys):
    local = plain["step"] / "actor"
    args = ["merge", "--local_dir", str(local), "--target_dir", str(tmp_path / "hf")]
    assert merge.main([*args, "--hf_upload_path", "me/model"]) == 2
    assert "jrl.merge does not upload" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


@pytest.fixture
def copied(plain, tmp_path) -> Path:
    """A copy of the plain checkpoint's step folder to damage."""
    return Path(shutil.copytree(plain["step"], tmp_path / "global_step_3"))


def _manifest(step: Path) -> dict:
    return json.loads((step / "checkpoint.json").read_text())


def _drop_model_item(step: Path) -> Path:
    manifest = _manifest(step)
    manifest["roles"]["actor"]["items"] = ["extra"]
    (step / "checkpoint.json").write_text(json.dumps(sealed(manifest)))  # saved that way
    return step / "actor"


def _delete_array_file(step: Path) -> Path:
    victim = next((step / "actor" / "model").rglob("manifest.ocdbt"))
    victim.unlink()
    return step / "actor"


def _unlisted_role(step: Path) -> Path:
    (step / "critic").mkdir()
    return step / "critic"


def _resize_mlp(step: Path) -> Path:
    """config.json describes another model (the manifest's entry updated to match)."""
    config_file = step / "actor" / "huggingface" / "config.json"
    config_file.write_text(
        config_file.read_text().replace('"intermediate_size": 64', '"intermediate_size": 48')
    )
    manifest = _manifest(step)
    manifest["files"]["actor/huggingface/config.json"] = {
        "size": config_file.stat().st_size,
        "xxh3": file_digest(config_file),
    }
    (step / "checkpoint.json").write_text(json.dumps(sealed(manifest)))
    return step / "actor"


def _no_manifest(step: Path) -> Path:
    (step / "checkpoint.json").unlink()
    return step / "actor"


@pytest.mark.parametrize(
    "damage, expected",
    [
        (lambda step: step / "nowhere", "does not exist"),
        (lambda step: step, "is a step folder"),
        (_no_manifest, "checkpoint.json is missing"),
        (_unlisted_role, "lists no 'critic' role, only ['actor']"),
        (_delete_array_file, "manifest.ocdbt is missing"),
        (_drop_model_item, "has no 'model' item"),
        (_resize_mlp, "down_proj.kernel: (64, 32) in the checkpoint, (48, 32) in config.json"),
    ],
)
def test_bad_local_dir_is_named(copied, tmp_path, capsys, damage, expected):
    local = damage(copied)
    args = ["merge", "--local_dir", str(local), "--target_dir", str(tmp_path / "out")]
    assert merge.main(args) == 2
    err = capsys.readouterr().err
    assert expected in err and str(local) in err
    assert not (tmp_path / "out").exists()


def test_bad_target_dir_is_refused(plain, tmp_path):
    local = plain["step"] / "actor"
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me")
    for target, expected in [
        (busy, "non-empty folder without config.json"),
        (busy / "notes.txt", "is a file"),
        (local / "huggingface", "overlaps the checkpoint"),
    ]:
        with pytest.raises(ValueError, match=expected) as err:
            merge.merge_checkpoint(local, target)
        assert str(target) in str(err.value)
    assert (busy / "notes.txt").read_text() == "keep me"
