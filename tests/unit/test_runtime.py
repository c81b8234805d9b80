"""init() in this process (a single process: no launcher variables): what it sets, and that it undoes it."""

from __future__ import annotations

import inspect
import os
import pickle
from pathlib import Path

import pytest
import torch

import gpuscale
from gpuscale.measure.metrics import SUMMARY_KEYS
from gpuscale.runtime import init as runtime
from gpuscale.strategy import strategy_of


@pytest.fixture(autouse=True)
def _single_process(single_process):
    """Every test here runs as a plain single process (tests/unit/conftest.py)."""


def test_single_process_setup_and_full_restore():
    before_env, before_aff = dict(os.environ), os.sched_getaffinity(0)
    with gpuscale.init() as rt:
        assert rt.env.launcher == "single" and rt.world_size == 1 and rt.is_main
        assert rt.backend is None and not rt.is_distributed
        assert rt.device == torch.device("cpu")
        assert set(rt.cores) == before_aff  # one rank keeps every allowed core
        assert os.environ["OMP_NUM_THREADS"] == str(len(rt.cores)) == str(torch.get_num_threads())
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
        assert os.environ["LOCAL_SIZE"] == "1"  # DeepSpeed's CPU accelerator's device count, as its launcher sets it
        assert gpuscale.current() is rt
        assert rt.placements == [rt.placement()] and rt.placements[0]["rank"] == 0
    assert dict(os.environ) == before_env
    assert os.sched_getaffinity(0) == before_aff
    with pytest.raises(RuntimeError, match="not active"):
        gpuscale.current()


def test_user_settings_are_kept(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.setenv("LOCAL_SIZE", "3")
    with gpuscale.init():
        assert os.environ["OMP_NUM_THREADS"] == "1"
        assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
        assert os.environ["LOCAL_SIZE"] == "3"


def test_exception_inside_propagates_and_state_is_reset(capsys):
    with pytest.raises(KeyError):
        with gpuscale.init():
            raise KeyError("boom")
    assert runtime._current is None
    assert "rank 0/1 on" in capsys.readouterr().err  # the failing rank names itself


def test_nested_init_is_refused():
    with gpuscale.init():
        with pytest.raises(RuntimeError, match="already active"):
            with gpuscale.init():
                pass


@pytest.mark.parametrize("kwargs, message", [
    ({"bind": "sideways"}, "bind='sideways'"),
    ({"timeout": 0}, "timeout"),
    ({"device": "tpu"}, "device='tpu'"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        with gpuscale.init(**kwargs):
            pass


def test_contradictory_environment_fails_before_anything_changes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")  # no MASTER_ADDR
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        with gpuscale.init():
            pass
    assert "OMP_NUM_THREADS" not in os.environ


def test_meter_summary_has_the_agreed_keys(tmp_path):
    with gpuscale.init():
        plan = gpuscale.plan_batch(4, 1)
        loader = gpuscale.make_loader(torch.utils.data.TensorDataset(torch.randn(10, 2)), plan)
        meter = gpuscale.Meter(plan)
        for _ in range(2):
            for (_x,) in meter.iter(loader):
                pass
        with meter.phase("eval"):
            pass
        with pytest.raises(ValueError, match="phase"):
            with meter.phase("lunch"):
                pass
        summary = meter.write_summary(tmp_path, final_loss=0.5, accuracy=0.75)
    on_disk = __import__("json").loads((tmp_path / "summary.json").read_text())
    assert on_disk["accuracy"] == 0.75 and on_disk["final_loss"] == 0.5
    assert all(key in on_disk for key in SUMMARY_KEYS)
    assert summary["steps"] == 4 and summary["epochs"] == 2 and summary["samples"] == 16  # drop_last: 2 batches of 4
    assert summary["world_size"] == 1 and summary["launcher"] == "single" and summary["strategy"] is None
    # the phases add up to the time to result; a Meter's summary ends its run: nothing comes after training
    assert sum(v or 0.0 for v in summary["time_split_s"].values()) == pytest.approx(summary["time_to_result_s"])
    assert summary["time_split_s"]["after_training"] == pytest.approx(0.0, abs=1e-6)
    assert oct(os.stat(tmp_path / "summary.json").st_mode & 0o777) == "0o644"


def test_steady_step_time_leaves_out_the_warm_up_and_evaluation(tmp_path):
    """A slow first step (as compilation makes it) counts in step_time_s, not in steady_step_time_s;
    evaluation after the warm-up counts in neither."""
    import time

    with gpuscale.init():
        plan = gpuscale.plan_batch(1, 1)
        loader = gpuscale.make_loader(torch.utils.data.TensorDataset(torch.randn(8, 2)), plan, shuffle=False)
        meter = gpuscale.Meter(plan, monitor=False, warmup_steps=2)
        for index, _ in enumerate(meter.iter(loader)):
            time.sleep(0.4 if index == 0 else 0.02)
            if index == 4:
                with meter.phase("eval"):
                    time.sleep(0.3)
        summary = meter.summary()
        few = gpuscale.Meter(plan, monitor=False, warmup_steps=10)
        for _ in few.iter(loader):
            pass
        assert few.summary()["steady_step_time_s"] is None, "no step after the warm-up: no steady figure"
    assert summary["steps"] == 8 and summary["warmup_steps"] == 2
    assert summary["step_time_s"] > 0.06, "all steps, the slow first one included"
    assert 0.015 < summary["steady_step_time_s"] < 0.045, summary["steady_step_time_s"]


def test_checkpointer_rotates_atomically_and_loads_only_weights(tmp_path):
    with gpuscale.init():
        model = gpuscale.wrap(torch.nn.Linear(3, 1))
        ckpt = gpuscale.Checkpointer(tmp_path, keep=2)
        assert ckpt.resume(model=model) is None and ckpt.peek() is None
        for step in (1, 2, 3):
            ckpt.save(step=step, model=model, epoch=0, extra={"note": step})
        # the last two kept, no temporary file left behind
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000002.pt", "step-000000002.pt.sha256",
                                                            "step-000000003.pt", "step-000000003.pt.sha256"]
        saved = torch.load(tmp_path / "step-000000003.pt", weights_only=True)
        assert sorted(saved["model"]) == ["bias", "weight"]  # no "module." prefix
        assert ckpt.peek().extra == {"note": 3}

        # a checkpoint that would run code when unpickled is refused, and the code does not run
        marker = tmp_path / "pwned"

        class Evil:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        evil = tmp_path / "step-000000009.pt"
        evil.write_bytes(pickle.dumps({"format": "gpuscale-checkpoint-1", "model": Evil()}, protocol=2))
        with pytest.raises(ValueError, match="refusing to load it"):
            ckpt.resume(model=model, path=evil)
        assert not marker.exists()
        # found as the newest, it is skipped (with a warning) for the newest readable one, still unrun
        assert ckpt.resume(model=model).step == 3
        assert not marker.exists()


def test_module_prefix_is_stripped_on_load():
    with gpuscale.init():
        model = gpuscale.wrap(torch.nn.Linear(2, 1))
        state = {f"module.{k}": torch.zeros_like(v) for k, v in gpuscale.unwrap(model).state_dict().items()}
        strategy_of(model).load_state_dict(model, state)
        assert torch.count_nonzero(gpuscale.unwrap(model).weight) == 0


def test_cluster_profile_core_map_decides_the_binding(monkeypatch):
    monkeypatch.setenv("GPUSCALE_GPU_CORES", "0;1")  # as gpuscale's batch scripts export it
    with gpuscale.init() as rt:
        assert rt.cores == (0,) and rt.binding.source == "gpu-local"
        assert os.sched_getaffinity(0) == {0}
    monkeypatch.setenv("GPUSCALE_GPU_CORES", "zero")
    with pytest.raises(ValueError, match="GPUSCALE_GPU_CORES"):
        with gpuscale.init():
            pass


def test_consolidate_refuses_missing_and_incomplete_checkpoints(tmp_path):
    from gpuscale.train.checkpoint import consolidate

    with pytest.raises(ValueError, match="does not exist"):
        consolidate(tmp_path / "step-000000001", tmp_path / "m.pt")
    (tmp_path / "step-000000002").mkdir()  # a sharded save killed before DCP wrote .metadata
    with pytest.raises(ValueError, match="no .metadata"):
        consolidate(tmp_path / "step-000000002", tmp_path / "m.pt")
    with gpuscale.init():
        model = gpuscale.wrap(torch.nn.Linear(2, 2))
        path = gpuscale.Checkpointer(tmp_path / "ck").save(step=1, model=model)
    consolidate(path, tmp_path / "m.pt")
    assert sorted(torch.load(tmp_path / "m.pt", weights_only=True)) == ["bias", "weight"]
    with pytest.raises(ValueError, match=f"holds the SHA-256 sums of a checkpoint, not the checkpoint; give {path}$"):
        consolidate(Path(f"{path}.sha256"), tmp_path / "m2.pt")  # its sums file, beside it
    with pytest.raises(ValueError, match=f"is not a checkpoint but holds 1: give one, e.g. the latest, {path}$"):
        consolidate(path.parent, tmp_path / "m2.pt")  # the checkpoints' folder, not one of them
    (tmp_path / "run").mkdir()
    with pytest.raises(ValueError, match="is not a sharded checkpoint .no .metadata.; give a step-. folder"):
        consolidate(tmp_path / "run", tmp_path / "m2.pt")  # a run's folder without checkpoints


def test_sharded_checkpoint_metadata_that_would_run_code_is_refused(tmp_path):
    from gpuscale.train.checkpoint import consolidate

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    bad = tmp_path / "step-000000003"
    bad.mkdir()
    (bad / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ValueError, match="refusing posix.system|refusing os.system|not trustworthy"):
        consolidate(bad, tmp_path / "m.pt")
    assert not marker.exists()


def test_saving_an_older_step_into_a_directory_with_newer_checkpoints_is_refused(tmp_path):
    with gpuscale.init():
        model = gpuscale.wrap(torch.nn.Linear(2, 1))
        gpuscale.Checkpointer(tmp_path).save(step=600, model=model)
        with pytest.raises(ValueError, match="already holds step-000000600.pt, newer than step 100"):
            gpuscale.Checkpointer(tmp_path).save(step=100, model=model)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000600.pt", "step-000000600.pt.sha256"]


def test_profile_core_map_follows_the_gpus_slurm_handed_out(monkeypatch):
    monkeypatch.setenv("GPUSCALE_GPU_CORES", "1;0")  # GPU 0 next to core 1, GPU 1 next to core 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # this job got GPU 1 (torch here sees none: CPU)
    with gpuscale.init() as rt:
        assert rt.cores == (0,)


def test_bad_input_inside_init_is_left_to_the_caller_in_one_process(capsys):
    """One process: the ValueError goes on to the caller (the CLI or the example prints it once); no second
    line from init, no traceback. With more ranks the failing rank names itself (tests/multiproc/test_failures.py)."""
    with pytest.raises(ValueError, match="--data /nowhere has no train/ folder"):
        with gpuscale.init():
            raise ValueError("--data /nowhere has no train/ folder")
    err = capsys.readouterr().err
    assert "failed" not in err and "Traceback" not in err


def test_every_strategy_answers_the_whole_protocol():
    """Each strategy takes the arguments the protocol names: a wrong arity is a TypeError deep in a user's run
    (gpuscale.wrap(model, strategy="deepspeed") was one, and DeepSpeed's load_optimizer_state_dict another)."""
    from gpuscale.strategy import STRATEGIES, Strategy

    methods = [name for name, value in vars(Strategy).items() if inspect.isfunction(value) and not name.startswith("_")]
    traits = [name for name in Strategy.__annotations__]
    assert {"backward", "step", "save_sharded", "load_sharded", "forward_context"} <= set(methods)
    assert {"sharded", "reshards", "channels_last_ok", "fused_by_default", "builds_engine"} <= set(traits)
    assert "sync_probe_blocker" in methods
    for name, cls in STRATEGIES.items():
        for method in methods:
            wanted = list(inspect.signature(getattr(Strategy, method)).parameters)
            assert list(inspect.signature(getattr(cls, method)).parameters) == wanted, (name, method)
        for trait in traits:
            assert hasattr(cls, trait), (name, trait)
        assert cls.name == name


def test_the_training_loop_asks_the_strategy_never_its_name():
    """Strategies own their differences: the step, the speed defaults and checkpoints ask the strategy's answers."""
    import gpuscale.runtime.speed
    import gpuscale.train.checkpoint
    import gpuscale.train.step

    for module in (gpuscale.train.step.Training, gpuscale.runtime.speed, gpuscale.train.checkpoint):
        source = inspect.getsource(module)
        assert "is_deepspeed" not in source, module
        for name in ("ddp", "fsdp", "deepspeed"):
            for test in (f'== "{name}"', f'!= "{name}"', f"== '{name}'", f"!= '{name}'"):
                assert test not in source, (module, test)
    assert "getattr(strategy" not in inspect.getsource(gpuscale.train.checkpoint)
    assert not {"strategy", "gradient_bytes", "collective_forward"} & set(gpuscale.Runtime.__dataclass_fields__)


def test_a_wrapped_model_is_announced_and_forgotten_with_its_runtime():
    from gpuscale.base import wrapped
    with gpuscale.init():
        model = gpuscale.wrap(torch.nn.Linear(3, 2))
        facts = wrapped.latest()
        assert facts == wrapped.Wrapped(strategy="ddp", gradient_bytes=(3 * 2 + 2) * 4, collective_forward=False)
        model.weight.requires_grad_(False)
        gpuscale.wrap(model)  # re-wrapped after freezing: only the bias synchronises now
        assert wrapped.latest().gradient_bytes == 2 * 4
    assert wrapped.latest() is None
    wrapped.announce(wrapped.Wrapped(strategy="fsdp", gradient_bytes=1))  # left over from outside any runtime
    with gpuscale.init():
        assert wrapped.latest() is None


def test_wrap_with_deepspeed_says_to_use_setup():
    with gpuscale.init():
        with pytest.raises(ValueError, match="use gpuscale.setup"):
            gpuscale.wrap(torch.nn.Linear(2, 1), strategy="deepspeed")
        strategy = gpuscale.strategy.get_strategy("deepspeed")
        with pytest.raises(ValueError, match="loaded with the checkpoint"):
            strategy.load_optimizer_state_dict(None, None, {})


def test_a_metric_that_is_not_numbers_is_refused_with_the_fix(single_process):
    with gpuscale.init(show_placement=False):
        with pytest.raises(TypeError, match=r"got a tensor of shape \(2, 2\); flatten it first"):
            gpuscale.all_reduce_sum(torch.ones(2, 2))
        with pytest.raises(TypeError, match="expected numbers"):
            gpuscale.all_reduce_max(["a"])


def test_env_tells_what_init_set_from_what_the_shell_had(single_process, monkeypatch, capsys):
    """`gpuscale env` runs inside gpuscale.init(), which sets OMP_NUM_THREADS and TOKENIZERS_PARALLELISM for itself:
    the listing says so, with the value before (doctor, outside init, sees the shell's)."""
    from gpuscale.cli import main

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert main(["env"]) == 0
    listed = capsys.readouterr().out.split("environment of rank 0")[1]
    assert "  TOKENIZERS_PARALLELISM=false  (set by gpuscale.init() here; unset before)" in listed
    assert "  OMP_NUM_THREADS=7\n" in listed + "\n"  # the user's own: init keeps it, so nothing to say
    assert "TOKENIZERS_PARALLELISM" not in os.environ  # and put back after


def test_a_deepspeed_checkpoint_is_told_by_its_layout_whoever_wrote_it(tmp_path):
    """gpuscale's (a `deepspeed` tag folder), DeepSpeed's own save_checkpoint (a `latest` file naming global_stepN, as
    in the HF Trainer's checkpoint-N), or such a tag folder itself: ZeRO-1/2's mp_rank_00_model_states.pt, or
    ZeRO-3's zero_pp_rank_0_mp_rank_00_model_states.pt. A sharded or plain checkpoint is none of them."""
    from gpuscale.strategy.deepspeed import deepspeed_tag

    ours = tmp_path / "step-000000010"
    (ours / "deepspeed").mkdir(parents=True)
    assert deepspeed_tag(ours) == (ours, "deepspeed")
    trainer = tmp_path / "checkpoint-6"
    (trainer / "global_step6").mkdir(parents=True)
    (trainer / "latest").write_text("global_step6\n")
    assert deepspeed_tag(trainer) == (trainer, "global_step6")
    (trainer / "global_step6" / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"")
    assert deepspeed_tag(trainer / "global_step6") == (trainer, "global_step6")
    sharded = tmp_path / "step-000000020"
    sharded.mkdir()
    (sharded / ".metadata").write_bytes(b"")
    assert deepspeed_tag(sharded) is None and deepspeed_tag(tmp_path / "step-000000030.pt") is None
