"""Several hosts, on one machine: two torchrun agents, each started as one node of a two-node run is on a cluster
(the same command on both: `--nnodes 2 --rdzv_backend c10d --rdzv_endpoint HOST:PORT --rdzv_id ID`, here on a free
local port), one process each on gloo. What is not tested here: a real network between hosts, NCCL, GPUs.

The program's promise on several nodes is one run folder that every node sees (README, "Several hosts"): the agents
of the test that trains share it; another gives each node a folder of its own, as node-local disks would.
"""

from __future__ import annotations

import socket
import time
import uuid

import pytest
from test_distributed import (
    COMMON,
    LOOSE_REL,
    ONE_PROCESS,
    STEPS,
    TIMEOUT_S,
    TWO,
    TWO_RANKS,
    Finished,
    assert_same_losses,
    metrics,
    one_process,
    torchrun,
)
from tiny import tiny_flags

from cs336_basics.errors import ConfigError
from cs336_basics.parallel import world
from cs336_basics.training.checkpoint import CHECKPOINT_FORMAT, CHECKPOINT_NAME, SHARDED_FORMAT, read_checkpoint

WAIT_S = 240  # the longest a two-node launch may take (about 25 s on two cores)
# When one agent has failed, the other's ranks stop on their own once they learn it (within RANK_0_REPORTS_S, 30 s,
# for a rank that leaves the report of a refusal to rank 0): past this the agent is stopped (Launch.kill), since an
# agent alone would wait for its peer at the rendezvous or in a collective for minutes.
PEER_FAILED_S = 60


def free_port() -> int:
    """A port nothing listens on now, for the rendezvous (its host's agent binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def two_nodes(args: list, cwds=(None, None)) -> list[Finished]:
    """Run `args` as a two-node run: two agents, one process each, in the working directories `cwds`. Returns both
    agents' results once both have ended (one that fails leaves the other PEER_FAILED_S to end; none runs past
    WAIT_S): a failure never hangs the test."""
    endpoint, run_id = f"127.0.0.1:{free_port()}", uuid.uuid4().hex
    rendezvous = ("--nnodes=2", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}")
    agents = [torchrun(args, nproc=1, rendezvous=rendezvous, cwd=cwd) for cwd in cwds]
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and any(a.proc.poll() is None for a in agents):
        if any(a.proc.poll() not in (None, 0) for a in agents):
            deadline = min(deadline, time.monotonic() + PEER_FAILED_S)
        time.sleep(0.5)
    for agent in agents:
        if agent.proc.poll() is None:
            agent.kill()
    return [agent.wait() for agent in agents]


def refused(agent: Finished) -> bool:
    """Whether this node's rank refused to start: torchrun reports the rank's exit code 2 (a refusal's), unless the
    other node's agent, which hosted the rendezvous store, left first: then this agent fails reading the store before
    it reports (a RendezvousConnectionError), and the rank's own "error:" line is what tells. Which agent leaves first
    is a race of their exits, not the program's choice."""
    lost_store = "RendezvousConnectionError" in agent.stderr and "]: error: " in agent.stderr
    return "exitcode: 2" in agent.stderr or lost_store


def both_logs(agents: list[Finished]) -> str:
    """Every agent's exit code and output (their ranks' and torchrun's), for a failure message."""
    return "\n".join(
        f"--- node {i}: exit {a.returncode} after {a.seconds:.0f} s ---\n{a.stdout[-2000:]}\n{a.stderr[-4000:]}"
        for i, a in enumerate(agents)
    )


@pytest.mark.slow
def test_two_nodes_train_and_one_process_continues_their_checkpoint(tmp_path, token_files):
    """Two nodes train 3 steps under FSDP2, each rank writing its shards into the shared run folder; one process
    resumes the sharded checkpoint (world size 2 -> 1) to step 6. The 6 steps give the losses of one uninterrupted
    process with the same global batch (within float32 summation order, as test_distributed's runs)."""
    base = [*tiny_flags(), *token_files, *COMMON]
    one_process([*base, *ONE_PROCESS, "--out_dir", tmp_path / "single"])
    run = tmp_path / "run"
    first = [*base, *TWO_RANKS, "--max_steps", "3", "--lr_decay_steps", STEPS, "--parallel", "fsdp", "--out_dir", run]
    agents = two_nodes(first)
    assert all(a.returncode == 0 for a in agents), both_logs(agents)
    printed = "".join(a.stdout for a in agents)
    assert printed.count("FINAL CONFIGURATION SUMMARY") == 1, both_logs(agents)  # one run: its rank 0 alone prints
    assert "fsdp, world size 2" in printed and "x 2 processes = 128 tokens per step" in printed
    sharded = read_checkpoint(run / CHECKPOINT_NAME)
    assert (sharded["format"], sharded["world_size"], sharded["step"]) == (SHARDED_FORMAT, 2, 3)

    one_process(["--resume", "--max_steps", STEPS, "--parallel", "auto", *ONE_PROCESS, "--out_dir", run])
    assert_same_losses(metrics(run), metrics(tmp_path / "single"), rel=LOOSE_REL)  # steps 1-3 two nodes, 4-6 one
    whole = read_checkpoint(run / CHECKPOINT_NAME)
    assert (whole["format"], whole["step"]) == (CHECKPOINT_FORMAT, STEPS)


@pytest.mark.slow
def test_a_resume_that_one_node_cannot_make_stops_both_at_once(tmp_path, token_files):
    """Each agent in a folder of its own and a relative --out_dir: each node sees its own run folder, as with
    node-local disks, and the checkpoint is on one node's alone. That node's rank may not wait for the other's, which
    refuses before the process group exists, until the group's timeout: both stop, each saying why."""
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
    (nodes[0] / "resume").mkdir()
    (nodes[0] / "resume" / CHECKPOINT_NAME).write_bytes(b"")  # enough for the check made before the process group
    args = [*tiny_flags(), *token_files, *TWO_RANKS, "--max_steps", "1", "--dist_timeout_s", TIMEOUT_S]
    resumed = two_nodes([*args, "--resume", "--out_dir", "resume"], cwds=nodes)
    assert all(a.returncode != 0 for a in resumed), both_logs(resumed)  # torchrun's 1: its ranks' refusal is 2
    assert all(refused(a) for a in resumed), both_logs(resumed)
    assert all(a.seconds < TIMEOUT_S / 2 for a in resumed), both_logs(resumed)
    said = "".join(a.stderr for a in resumed)
    assert "--resume was given but resume does not exist" in said, both_logs(resumed)
    assert "another rank refused to start (its message says why)" in said, both_logs(resumed)


@pytest.mark.slow
def test_nodes_without_a_shared_run_folder_stop_before_writing_to_it(tmp_path, token_files):
    """Each node its own folder (as in the test above) for a new run: every folder passes the first checks, and
    without this stop the ranks of an FSDP2 run would scatter their checkpoint's shards over the nodes' disks."""
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
    args = [*tiny_flags(), *token_files, *TWO_RANKS, "--max_steps", "1", "--parallel", "fsdp", "--out_dir", "run"]
    agents = two_nodes(args, cwds=nodes)
    assert all(a.returncode != 0 for a in agents), both_logs(agents)
    assert all(refused(a) for a in agents), both_logs(agents)
    said = "".join(a.stderr for a in agents)
    assert "is not the run folder rank 0 holds: its lock (held by PID" in said, both_logs(agents)
    assert "another rank does not see the run folder run" in said, both_logs(agents)
    # Nothing left behind: rank 0's lock (on whichever node it ran) went with the folder it created.
    assert not any((node / "run").exists() for node in nodes), [list(node.rglob("*")) for node in nodes]


# ---- fast: how a refusal some ranks make reaches the others (the collectives simulated) ----


@pytest.mark.parametrize(
    "here, others, raised, every_rank",
    [
        (False, [False], None, None),  # nobody refused: go on
        (True, [True], "own", True),  # alike everywhere: rank 0 reports it
        (True, [False], "own", False),  # this rank alone: it says so itself
        (False, [True], "stopped", True),  # another rank alone: this one stops, pointing at it
    ],
)
def test_a_refusal_of_some_ranks_stops_every_rank(monkeypatch, here, others, raised, every_rank):
    monkeypatch.setattr(world, "agree_any", lambda flag: flag or any(others))
    monkeypatch.setattr(world, "agree_all", lambda flag: flag and all(others))
    refusal = ConfigError("the checkpoint is missing") if here else None
    if raised is None:
        world.refuse_together(refusal, TWO, "elsewhere")
        return
    with pytest.raises(ConfigError) as caught:
        world.refuse_together(refusal, TWO, "another rank refused")
    assert caught.value.every_rank is every_rank
    expected = "the checkpoint is missing" if raised == "own" else "rank 0 stopped: another rank refused"
    assert str(caught.value) == expected


def test_one_process_raises_its_refusal_without_collectives():
    world.refuse_together(None, world.SINGLE, "unused")
    with pytest.raises(ConfigError, match="missing"):
        world.refuse_together(ConfigError("missing"), world.SINGLE, "unused")
