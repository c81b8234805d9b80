"""`gpuscale lint`: every planted mistake of the corpus is found at its line, and nothing else.

Each script in lint_corpus/ marks the lines where a finding is expected with `# expect: GS1xx`;
the clean_* scripts mark none and must give no finding at all. The project's own examples and
multi-process test scripts are written the right way and must be clean too.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gpuscale
from gpuscale.cli import main
from gpuscale.lint import RULE_IDS, RULES, Finding, lint_paths, lint_source, select_rules

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "lint_corpus"
SCRIPTS = sorted(CORPUS.glob("*.py"))
EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9, ]+)")


def expected(path: Path) -> set[tuple[int, str]]:
    marks = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if match := EXPECT.search(line):
            marks.update((number, rule.strip()) for rule in match.group(1).split(",") if rule.strip())
    return marks


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_corpus_findings_are_exactly_the_planted_mistakes(script):
    found = {(f.line, f.rule) for f in lint_paths([script])}
    assert found == expected(script)


def test_corpus_plants_every_rule_and_has_clean_scripts():
    planted = {rule for script in SCRIPTS for _, rule in expected(script)}
    assert planted == set(RULE_IDS)
    clean = [p for p in SCRIPTS if p.name.startswith("clean_")]
    assert len(clean) >= 5 and all(not expected(p) for p in clean)


def test_project_examples_and_multiproc_scripts_are_clean():
    assert lint_paths([ROOT / "examples", ROOT / "tests" / "multiproc" / "scripts"]) == []


def test_fixes_name_only_real_gpuscale_calls():
    for rule in RULES:
        for name in re.findall(r"gpuscale\.(\w+)", rule.fix):
            assert hasattr(gpuscale, name), f"{rule.id} names gpuscale.{name}, which does not exist"
        assert rule.id.startswith("GS1") and rule.title and rule.why and rule.fix


DDP_PRINT = """\
import torch.distributed as dist
dist.init_process_group("gloo")
print("hello"){comment}
dist.destroy_process_group()
"""


@pytest.mark.parametrize("comment, silenced", [
    ("  # gpuscale: ignore[GS103]", True),
    ("  # gpuscale: ignore", True),
    ("  # gpuscale: ignore[GS101, GS103]", True),
    ("  # gpuscale: ignore[gs103]", True),
    ("  # gpuscale: ignore[GS105]", False),
    ("  # a comment", False),
])
def test_suppression_comment_on_the_line(comment, silenced):
    findings = lint_source(DDP_PRINT.format(comment=comment), "train.py")
    assert [f.rule for f in findings] == ([] if silenced else ["GS103"])


def test_finding_carries_place_title_why_and_fix():
    (finding,) = lint_source(DDP_PRINT.format(comment=""), "train.py")
    assert isinstance(finding, Finding)
    assert (finding.path, finding.line, finding.col, finding.rule) == ("train.py", 3, 1, "GS103")
    assert "gpuscale.print0" in finding.fix and finding.why
    assert finding.format().splitlines()[0] == "train.py:3:1: GS103 print() runs on every rank"
    with pytest.raises(AttributeError):
        finding.line = 4  # frozen


def test_a_single_process_script_has_no_findings():
    text = 'import torch\nprint("hi")\ntorch.save({}, "x.pt")\ndevice = "cuda:0"\nn = 25 // 2\n'
    assert lint_source(text) == []


@pytest.mark.parametrize("guard", [
    "if rank == 0:", "if rt.is_main:", "if dist.get_rank() == 0:", "if local_rank in (-1, 0):",
    "if trainer.is_world_process_zero():", "if accelerator.is_main_process:", "if args.should_save:",
])
def test_rank_guards_are_understood(guard):
    text = f"import torch\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n{guard}\n" \
           "    print('once')\n    torch.save({{}}, 'x.pt')\ndist.destroy_process_group()\n"
    assert lint_source(text) == []


def test_early_return_is_a_guard():
    text = """\
import torch
import torch.distributed as dist
def save(state):
    if not dist.get_rank() == 0:
        return
    torch.save(state, "x.pt")
dist.init_process_group("gloo")
save({})
dist.destroy_process_group()
"""
    assert lint_source(text) == []


def test_syntax_error_is_bad_input():
    with pytest.raises(ValueError, match=r"broken\.py:1: not valid Python"):
        lint_source("def (:\n", "broken.py")


def test_select_and_ignore_rules():
    assert [r.id for r in select_rules(["GS103"])] == ["GS103"]
    assert "GS103" not in [r.id for r in select_rules(None, ["GS103"])]
    with pytest.raises(ValueError, match="unknown rule id GS999; valid ids: GS101"):
        select_rules(["GS999"])


def test_cli_in_process_text_and_select(capsys):
    script = str(CORPUS / "bad_gs103_print.py")
    assert main(["lint", script]) == 1
    out = capsys.readouterr().out
    assert f"{script}:13:5: GS103 print() runs on every rank" in out
    assert "\n    why: " in out and "\n    fix: " in out and out.rstrip().endswith("2 finding(s) in 1 file(s)")
    assert main(["lint", script, "--ignore", "GS103"]) == 0
    assert capsys.readouterr().out.strip() == "no findings"
    assert main(["lint", script, "--select", "GS101,GS102"]) == 0
    assert main(["lint", script, "--select", "GS1"]) == 2
    assert "unknown rule id GS1;" in capsys.readouterr().err


def test_cli_lints_folders_recursively(tmp_path, capsys):
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    (nested / "train.py").write_text(DDP_PRINT.format(comment=""))
    (tmp_path / "notes.txt").write_text("not python")
    assert main(["lint", str(tmp_path), "--format", "json"]) == 1
    (finding,) = json.loads(capsys.readouterr().out)
    assert finding["path"] == str(nested / "train.py") and finding["rule"] == "GS103"


def gpuscale_lint(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "gpuscale", "lint", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_a_script_named_but_not_checked_is_said_to_be(tmp_path, capsys):
    """A script with no sign of several processes (a Lightning script told devices=1, say) is not checked: "no
    findings" alone would read as a clean bill. A folder's helper modules are not named."""
    single = tmp_path / "single.py"
    single.write_text("print('hi')\n")
    assert main(["lint", str(single), str(CORPUS / "clean_ddp_guards.py")]) == 0
    assert capsys.readouterr().out.strip() == (f"no findings; not checked: {single} (no sign of running as several processes: "
                                               "no process group, DDP/FSDP/DeepSpeed, gpuscale, Accelerate, HF or Lightning "
                                               "Trainer, or RANK/WORLD_SIZE read; see docs/lint.md)")
    assert main(["lint", str(tmp_path)]) == 0 and capsys.readouterr().out.strip() == "no findings"


def test_cli_exit_codes_and_json_subprocess(tmp_path):
    clean = gpuscale_lint("examples", str(CORPUS / "clean_ddp_guards.py"))
    assert (clean.returncode, clean.stdout.strip()) == (0, "no findings"), clean.stderr
    bad = gpuscale_lint("--format", "json", str(CORPUS / "bad_gs109_division.py"))
    assert bad.returncode == 1, bad.stderr
    findings = json.loads(bad.stdout)
    assert [(f["line"], f["rule"]) for f in findings] == [(19, "GS109"), (20, "GS109")]
    assert set(findings[0]) == {"path", "line", "col", "rule", "title", "why", "fix"}
    assert "gpuscale.plan_batch" in findings[0]["fix"]


@pytest.mark.parametrize("name, content, message", [
    ("missing.py", None, "missing.py does not exist"),
    ("notes.txt", "just text\n", "notes.txt is not a Python file"),
    ("broken.py", "def f(:\n    pass\n", "broken.py:1: not valid Python"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    result = gpuscale_lint(str(path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.startswith("gpuscale lint: error: ")
    assert "no findings" not in result.stdout or "not linted" in result.stdout  # a file not read is not a clean file


def test_lint_help_lists_rules_and_examples():
    result = gpuscale_lint("--help")
    assert result.returncode == 0
    assert "gpuscale lint train.py" in result.stdout and "GS113" in result.stdout and "gpuscale: ignore[GS103]" in result.stdout


def test_a_flag_assigned_from_a_rank_test_is_a_guard_but_other_variables_are_not():
    text = """\
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
verbose = rank == 0
device = torch.device("cpu", rank)
if verbose:
    print("once")
if device.type == "cpu":
    print("every rank")
dist.destroy_process_group()
"""
    assert [(f.line, f.rule) for f in lint_source(text)] == [(10, "GS103")]


def test_unfreezing_after_accelerate_prepare():
    text = """\
from accelerate import Accelerator
import torch
accelerator = Accelerator()
model = torch.nn.Linear(2, 2)
model.requires_grad_(False)
model = accelerator.prepare(model)
model.requires_grad_(True)
"""
    assert [(f.line, f.rule) for f in lint_source(text)] == [(7, "GS108")]


MULTILINE_PRINT = """\
import torch.distributed as dist
dist.init_process_group("gloo")
print({first}
    "hello",{middle}
    "world",
){last}
dist.destroy_process_group()
"""


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_suppression_comment_on_any_line_of_a_multiline_statement(where):
    comments = {"first": "", "middle": "", "last": ""}
    comments[where] = "  # gpuscale: ignore[GS103]"
    assert lint_source(MULTILINE_PRINT.format(**comments)) == []
    assert [(f.line, f.rule) for f in lint_source(MULTILINE_PRINT.format(first="", middle="", last=""))] == [(3, "GS103")]


def test_suppression_comment_on_another_statement_does_not_silence():
    text = MULTILINE_PRINT.format(first="", middle="", last="") + "x = 1  # gpuscale: ignore\n"
    assert [(f.line, f.rule) for f in lint_source(text)] == [(3, "GS103")]


METRIC_SCRIPT = """\
import torch
import torch.distributed as dist
{imports}
dist.init_process_group("gloo")
def evaluate(model, loader):
    correct = 0
    for x, y in loader:
        correct += (model(x).argmax(1) == y).sum()
    {reduction}
    return correct
dist.destroy_process_group()
"""


@pytest.mark.parametrize("imports, reduction, reduced", [
    ("", "dist.all_reduce(correct)", True),
    ("", "dist.reduce(correct, dst=0)", True),
    ("", "dist.gather(correct, dst=0)", True),
    ("from torch.distributed import gather", "gather(correct)", True),
    ("from accelerate import Accelerator\naccelerator = Accelerator()", "correct = accelerator.gather(correct)", True),
    ("", "correct = self.accelerator.reduce(correct)", True),
    ("", "correct = fabric.all_reduce(correct)", True),
    ("import gpuscale", "gpuscale.all_reduce_sum([correct])", True),
    ("", "picked = correct.gather(0, torch.zeros(1, dtype=torch.long))", False),
    ("", "picked = torch.gather(correct, 0, torch.zeros(1, dtype=torch.long))", False),
    ("import functools, operator", "n = functools.reduce(operator.add, [1, 2])", False),
    ("from functools import reduce", "n = reduce(lambda a, b: a + b, [1, 2])", False),
])
def test_only_collectives_count_as_reducing_metrics(imports, reduction, reduced):
    findings = lint_source(METRIC_SCRIPT.format(imports=imports, reduction=reduction))
    assert [f.rule for f in findings] == ([] if reduced else ["GS107"])


def test_a_method_called_unguarded_through_self_is_unguarded():
    text = """\
import torch.distributed as dist
class Trainer:
    def report(self):
        print("report")
    def fit(self):
        self.report()
class Other:
    def report(self):
        pass
dist.init_process_group("gloo")
t = Trainer()
if dist.get_rank() == 0:
    t.report()
t.fit()
Other().report()
dist.destroy_process_group()
"""
    assert [(f.line, f.rule) for f in lint_source(text)] == [(4, "GS103")]


def test_a_method_called_only_on_unresolved_receivers_is_guarded_if_one_call_is():
    text = """\
import torch.distributed as dist
class Trainer:
    def evaluate(self):
        print("evaluate")
def run(trainer, judge):
    if dist.get_rank() == 0:
        trainer.evaluate()
    judge.evaluate()
dist.init_process_group("gloo")
dist.destroy_process_group()
"""
    assert lint_source(text) == []


@pytest.mark.parametrize("line, flagged", [
    ('print(f"rank {rank} ready")', False),
    ('print(f"[{dist.get_rank()}] ready")', False),
    ('print("rank %d ready" % local_rank)', False),
    ('print("rank {} ready".format(rank))', False),
    ('print("rank", rank, "ready")', False),
    ('print("rank 0 is slow")', True),
    ('print(f"epoch {epoch}")', True),
])
def test_a_print_that_tells_its_rank_is_deliberate(line, flagged):
    text = f"import torch.distributed as dist\ndist.init_process_group('gloo')\nrank = local_rank = epoch = 0\n{line}\n" \
           "dist.destroy_process_group()\n"
    assert [f.rule for f in lint_source(text)] == (["GS103"] if flagged else [])


def test_cli_folder_with_an_unparsable_file_lints_the_rest_and_exits_2(tmp_path):
    (tmp_path / "a_broken.py").write_text("def f(:\n    pass\n")
    (tmp_path / "b_train.py").write_text(DDP_PRINT.format(comment=""))
    (tmp_path / "c_bad_encoding.py").write_bytes(b"# -*- coding: nope -*-\nx = 1\n")
    result = gpuscale_lint(str(tmp_path))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and "Traceback" not in result.stderr
    assert lines[0].startswith("gpuscale lint: error: ") and "a_broken.py:1: not valid Python" in lines[0]
    assert "fix the syntax error" in lines[0]
    assert "c_bad_encoding.py" in lines[1]
    assert f"{tmp_path / 'b_train.py'}:3:1: GS103 print() runs on every rank" in result.stdout
    assert result.stdout.rstrip().endswith("1 finding(s) in 1 file(s) (2 file(s) not linted: above)")
    as_json = gpuscale_lint("--format", "json", str(tmp_path))
    assert as_json.returncode == 2 and [f["rule"] for f in json.loads(as_json.stdout)] == ["GS103"]


def test_lint_paths_collects_unparsable_files_when_asked(tmp_path):
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "train.py").write_text(DDP_PRINT.format(comment=""))
    with pytest.raises(ValueError, match="broken.py:1: not valid Python"):
        lint_paths([tmp_path])
    errors: list[str] = []
    assert [f.rule for f in lint_paths([tmp_path], errors=errors)] == ["GS103"]
    assert len(errors) == 1 and "broken.py:1: not valid Python" in errors[0]


SPLIT_SCRIPT = """\
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset, random_split
from transformers import set_seed
dist.init_process_group("gloo")
rank = dist.get_rank()
seed_offset = rank
data = TensorDataset(torch.randn(8, 2))
{before}
train, val = random_split(data, [6, 2]{generator})
{after}
dist.destroy_process_group()
"""


@pytest.mark.parametrize("before, generator, after, flagged", [
    ("torch.manual_seed(0)", "", "", False),
    ("set_seed(42)", "", "", False),
    ("", ", generator=torch.Generator().manual_seed(42)", "", False),
    ("", ", torch.Generator().manual_seed(42)", "", False),
    ("", "", "", True),
    ("torch.manual_seed(0 + rank)", "", "", True),
    ("torch.manual_seed(1337 + seed_offset)", "", "", True),
    ("", ", generator=torch.Generator().manual_seed(rank)", "", True),
    ("np.random.seed(0)", "", "", True),
    ("", "", "torch.manual_seed(0)", True),
    ("if rank == 0:\n    torch.manual_seed(0)", "", "", True),
])
def test_a_split_is_seeded_only_by_a_seed_that_is_the_same_on_every_rank_and_comes_first(before, generator, after, flagged):
    findings = lint_source(SPLIT_SCRIPT.format(before=before, generator=generator, after=after))
    assert [f.rule for f in findings] == (["GS114"] if flagged else [])


SPAWN_GLOBALS = """\
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset
class Squares(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return i * i * scale
def worker(rank=0):
    dist.init_process_group("gloo")
    for batch in DataLoader(Squares(), num_workers=2):
        print(rank, batch)
    dist.destroy_process_group()
if __name__ == "__main__":
    scale = 2
    {start}
"""


@pytest.mark.parametrize("start, flagged", [
    ("worker()", False),  # torchrun: every rank runs this block
    ("mp.set_start_method('fork')\n    worker()", False),
    ("mp.set_start_method('spawn')\n    worker()", True),  # DataLoader workers import the script as __mp_main__
    ("mp.spawn(worker, nprocs=2)", True),
])
def test_main_only_globals_matter_only_where_processes_are_spawned(start, flagged):
    findings = lint_source(SPAWN_GLOBALS.format(start=start), rules=select_rules(["GS115"]))
    assert [(f.line, f.rule) for f in findings] == ([(8, "GS115")] if flagged else [])


SPAWN_OR_DIRECT = """\
import functools
import torch.distributed as dist
import torch.multiprocessing as mp
{process_import}
def worker(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    print("ready")
    dist.destroy_process_group()
def write_logs(queue):
    print("writer started")
def main(world_size):
    print("launching")
    {start}
    worker(0, 1)
"""


@pytest.mark.parametrize("process_import, start, flagged", [
    ("", "mp.spawn(worker, args=(world_size,), nprocs=world_size)", [7, 10]),
    ("", "mp.spawn(functools.partial(worker, world_size=world_size), nprocs=world_size)", [7, 10]),
    ("", "mp.start_processes(worker, args=(world_size,), nprocs=world_size, start_method='fork')", [7, 10]),
    ("from multiprocessing import Process", "Process(target=worker, args=(0, world_size)).start()", [7, 10]),
    # a Process that does not join the group is no rank: main is not a launcher then
    ("from multiprocessing import Process", "Process(target=write_logs, args=(None,)).start()", [7, 10, 12]),
    ("", "pass", [7, 10, 12]),  # no launcher: main runs wherever torchrun runs it
])
def test_a_rank_function_is_per_rank_code_even_where_it_is_also_called_directly(process_import, start, flagged):
    findings = lint_source(SPAWN_OR_DIRECT.format(process_import=process_import, start=start), rules=select_rules(["GS103"]))
    assert [f.line for f in findings] == flagged


DIVISION = """\
import torch.distributed as dist
def validate(args, world_size):
    {check}
def setup(args):
    dist.init_process_group("gloo")
    world_size = dist.get_world_size()
    validate(args, world_size)
    per_rank = args.batch_size // world_size
    dist.destroy_process_group()
    return per_rank
def elsewhere(args, world_size):
    return args.batch_size % world_size
"""


@pytest.mark.parametrize("check, flagged", [
    ("assert args.batch_size % world_size == 0", False),  # in a function the division's function runs first
    ("if args.batch_size % world_size:\n        raise ValueError('uneven')", False),
    ("assert args.rank % world_size == 0", True),  # another value
    ("assert args.batch_size % 8 == 0", True),  # another divisor
    ("pass", True),  # `elsewhere` takes the same remainder, but nothing on the division's path runs it
])
def test_only_a_check_of_the_same_batch_on_the_divisions_path_silences_gs109(check, flagged):
    findings = lint_source(DIVISION.format(check=check), rules=select_rules(["GS109"]))
    assert [f.line for f in findings] == ([8] if flagged else [])


SAVE_HELPER = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
def keep(state, path):
    {helper}
def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(2, 2))
    if dist.get_rank() == 0:
        {call}
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("helper, call, flagged", [
    ("torch.save(state, path)", "keep(model.state_dict(), 'a.pt')", True),
    ("torch.save(state, path)", "keep(path='a.pt', state={'model': model.state_dict()})", True),
    ("torch.save({'model': state}, path)", "keep(model.state_dict(), 'a.pt')", True),
    ("blob = {'model': state}; torch.save(blob, path)", "keep(model.state_dict(), 'a.pt')", True),
    ("torch.save(state.state_dict(), path)", "keep(model, 'a.pt')", True),
    ("torch.save(state, path)", "keep(model.module.state_dict(), 'a.pt')", False),
    ("torch.save(state.module.state_dict(), path)", "keep(model, 'a.pt')", False),
    ("print(len(state), path)", "keep(model.state_dict(), 'a.pt')", False),  # not saved
    ("torch.save(path, 'paths.pt')", "keep(model.state_dict(), 'a.pt')", False),  # another parameter saved
])
def test_gs106_follows_a_state_dict_into_the_helper_that_saves_it(helper, call, flagged):
    findings = lint_source(SAVE_HELPER.format(helper=helper, call=call), rules=select_rules(["GS106"]))
    assert [f.line for f in findings] == ([10] if flagged else [])


SPAWNED = ("import torch\nimport torch.distributed as dist\nimport torch.multiprocessing as mp\n\n"
           "def worker({param}, world):\n    dist.init_process_group('gloo', rank={param}, world_size=world)\n"
           "    if {test}:\n        print('loss', 1.0)\n    dist.destroy_process_group()\n\n"
           "if __name__ == '__main__':\n    mp.spawn(worker, args=(2,), nprocs=2)\n")


@pytest.mark.parametrize("param, test, flagged", [
    ("gpu", "gpu == 0", False), ("proc_id", "not proc_id", False), ("idx", "0 == idx and True", False),
    ("gpu", "gpu is not None", True),  # true on every process: no guard
    ("gpu", "world > 1", True),
])
def test_the_spawned_process_index_is_a_rank_whatever_it_is_called(param, test, flagged):
    found = [f.rule for f in lint_source(SPAWNED.format(param=param, test=test))]
    assert ("GS103" in found) == flagged, found


SAMPLED = ("import torch\nimport torch.distributed as dist\nfrom torch.utils.data import DataLoader, DistributedSampler, "
           "SequentialSampler\ndist.init_process_group('gloo')\nds = list(range(10))\n{choice}\n"
           "loader = DataLoader(ds, sampler=sampler)\ndist.destroy_process_group()\n")


@pytest.mark.parametrize("choice, flagged", [
    ("sampler = DistributedSampler(ds) if args.dist_eval else SequentialSampler(ds)", True),
    ("if args.dist_eval:\n    sampler = DistributedSampler(ds)\nelse:\n    sampler = SequentialSampler(ds)", True),
    ("sampler = DistributedSampler(ds) if args.distributed else SequentialSampler(ds)", False),  # one process: right
    ("sampler = DistributedSampler(ds) if world_size > 1 else SequentialSampler(ds)", False),
    ("sampler = DistributedSampler(ds)", False),
])
def test_a_sampler_an_option_picks_is_reported_by_its_plain_branch(choice, flagged):
    found = [f for f in lint_source(SAMPLED.format(choice=choice)) if f.rule == "GS101"]
    assert bool(found) == flagged, found
    if flagged:
        assert "plain one unless args.dist_eval" in found[0].title


def test_print_replaced_by_the_scripts_own_module_or_shown_by_force(tmp_path):
    main = ("import torch\nimport torch.distributed as dist\nimport {module}\n{module}.init_distributed_mode()\n"
            "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))\n"
            "print('epoch 1')\ndist.destroy_process_group()\n")
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "dist.py").write_text(
        "import builtins\nimport torch.distributed as dist\n\ndef init_distributed_mode():\n"
        "    dist.init_process_group('gloo')\n    original = builtins.print\n"
        "    builtins.print = lambda *a, **k: dist.get_rank() == 0 and original(*a)\n")
    (tmp_path / "plain.py").write_text("import torch.distributed as dist\n\ndef init_distributed_mode():\n"
                                       "    dist.init_process_group('gloo')\n")
    script = tmp_path / "train.py"
    script.write_text(main.format(module="helpers.dist"))
    assert [f.rule for f in lint_paths([script])] == []
    script.write_text(main.format(module="plain"))  # a module of its own that does not replace print
    assert [f.rule for f in lint_paths([script])] == ["GS103"]
    script.write_text(main.format(module="plain").replace("print('epoch 1')", "print('epoch 1', force=True)"))
    assert [f.rule for f in lint_paths([script])] == []  # force= exists only on a replaced print


def test_findings_of_one_rule_in_one_script_are_grouped(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                      + "".join(f"print({i})\n" for i in range(20)) + "dist.destroy_process_group()\n")
    lines = gpuscale.lint.format_findings(lint_paths([script]))
    assert len(lines) == 20 and lines[0].count("\n") == 2  # one block with why and fix, then one line per place
    assert all(line.endswith("(why and fix as above)") and ":GS103" not in line for line in lines[1:])
    assert [line.split(":")[1] for line in lines] == [str(n) for n in range(3, 23)]


@pytest.mark.parametrize(("line", "flagged"), [
    ("pass", True),
    ('print(os.environ.get("CUDA_VISIBLE_DEVICES"))', True),  # reading it chooses nothing
    ('os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["LOCAL_RANK"]', False),  # each rank sees only its own GPU
    ('os.environ.setdefault("HIP_VISIBLE_DEVICES", os.environ["LOCAL_RANK"])', False),
    ('torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))', False),
])
def test_gs116_the_current_gpu_is_chosen_by_setting_it_not_by_reading_it(line, flagged):
    source = ("import os\nimport torch\nimport torch.distributed as dist\n\n\ndef main():\n    dist.init_process_group('nccl')\n"
              f"    {line}\n    model = torch.nn.Linear(2, 2).cuda()\n    used = torch.cuda.memory_allocated(device='cuda')\n"
              "    dist.destroy_process_group()\n")
    found = [(f.rule, f.line) for f in lint_source(source, "t.py") if f.rule == "GS116"]
    assert found == ([("GS116", 9)] if flagged else [])  # at the model's .cuda(), not at torch.cuda's query


def test_a_library_trainer_makes_a_script_one_of_several_processes_and_its_own_reductions_count():
    """HF's Trainer (or a class derived from it) and Lightning's Trainer run the script as several processes under a
    launcher, though it reads no rank: its every-rank prints are found. A Lightning Trainer told devices=1 is one
    process. What the libraries reduce for the script is reduced: `self.log(..., sync_dist=True)`, and the
    predictions HF's Trainer gathers for `compute_metrics`."""
    from gpuscale.lint import lint_source

    hf = ("from transformers import Trainer\n"
          "class MyTrainer(Trainer):\n    pass\n"
          "def compute_metrics(p):\n    correct = (p.predictions.argmax(-1) == p.label_ids).sum()\n"
          "    accuracy = correct / len(p.label_ids)\n    return {'accuracy': accuracy}\n"
          "trainer = MyTrainer(model=None, compute_metrics=compute_metrics)\ntrainer.train()\nprint('trained')\n")
    assert [(f.rule, f.line) for f in lint_source(hf)] == [("GS103", 10)]
    lightning = ("import lightning as L\nimport torch\n"
                 "class M(L.LightningModule):\n    def validation_step(self, batch, i):\n"
                 "        acc = (self(batch[0]).argmax(1) == batch[1]).float().mean()\n        self.log('val_acc', acc{sync})\n"
                 "trainer = L.Trainer({devices})\ntrainer.fit(M())\nprint('done')\n")
    assert [(f.rule, f.line) for f in lint_source(lightning.format(sync="", devices="devices=4"))] == [("GS107", 6), ("GS103", 9)]
    assert [(f.rule, f.line) for f in lint_source(lightning.format(sync=", sync_dist=True", devices=""))] == [("GS103", 9)]
    skipped: list[str] = []
    assert lint_source(lightning.format(sync="", devices="devices=1"), "one.py", skipped=skipped) == [] and skipped == ["one.py"]


@pytest.mark.parametrize("library, guard", [("from accelerate import Accelerator", "accelerator.is_main_process"),
                                            ("import lightning as L", "trainer.is_global_zero"),
                                            ("import torch.distributed as dist", "rt.is_main")])
def test_a_fix_guards_with_the_main_process_test_of_the_scripts_own_library(library, guard):
    source = (f"{library}\nimport torch\nimport torch.distributed as dist\n"
              "dist.init_process_group('gloo')\nprint('loss', 1.0)\n")
    [finding] = lint_source(source, rules=select_rules(["GS103"]))
    assert f"`if {guard}:`" in finding.fix


def test_fixes_inside_a_lightning_module_and_for_accelerates_model_are_the_librarys_own():
    source = ("import lightning as L\nimport torch\n\nclass Model(L.LightningModule):\n"
              "    def training_step(self, batch, index):\n        print('loss', 1.0)\n\n"
              "L.Trainer(accelerator='cpu', devices=2, strategy='ddp').fit(Model())\n")
    [finding] = lint_source(source, rules=select_rules(["GS103"]))
    assert "`if self.trainer.is_global_zero:`" in finding.fix  # `trainer` alone is undefined in a module's method
    [saved] = lint_source((CORPUS / "bad_gs106_accelerate_prepare.py").read_text(), rules=select_rules(["GS106"]))
    assert saved.fix.startswith("save accelerator.unwrap_model(model).state_dict()")
