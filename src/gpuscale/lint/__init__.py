"""`gpuscale lint`: find the classic multi-GPU mistakes in a PyTorch training script, before it runs.

The linter reads the script (the standard library's `ast`; nothing is imported or executed) and
reports, for a script that runs as several processes, each line that will misbehave on more than
one GPU: what is wrong, why it matters, and the gpuscale call that does it right.

    from gpuscale.lint import lint_paths, lint_source
    for finding in lint_paths(["train.py"]):
        print(finding.format())

Rules (each a small function in rules_data, rules_metrics, rules_ranks, rules_setup, rules_deepspeed,
rules_seeds, rules_spawn; table in `gpuscale.lint.rules`):

    GS101  DataLoader without a DistributedSampler: every rank reads (or evaluates) the whole dataset
    GS102  DistributedSampler, but set_epoch() never called: the same shuffle every epoch
    GS103  print() on every rank (no rank guard)
    GS104  standard-library INFO logging on every rank (gpuscale.get_logger filters by rank itself)
    GS105  torch.save / save_pretrained (without is_main_process=) on every rank
    GS106  the DDP wrapper's state_dict() saved: every key starts with 'module.'
    GS107  accuracy of one rank's shard, never reduced over the ranks, reported as the dataset's
    GS108  parameters unfrozen (requires_grad = True) after DDP/FSDP/DeepSpeed/gpuscale wrapped the model
    GS109  batch // world_size (or int(batch / world_size)): the remainder silently dropped
    GS110  hard-coded MASTER_PORT, or a tcp://host:PORT init_method
    GS111  hard-coded GPU index: "cuda:0", .cuda(0), set_device(0), device_ids=[0]
    GS112  init_process_group() without destroy_process_group()
    GS113  DeepSpeed config batch sizes that disagree with the DataLoader's per-rank batch
    GS114  random_split / train_test_split, or a shuffle that decides each rank's samples, seeded
           differently on every rank (unseeded, or seed + rank): validation leaks into training
    GS115  a function run by mp.spawn's children reads a global assigned only under
           `if __name__ == "__main__":` (the children import the script as __mp_main__: NameError)

A script is distributed when it calls init_process_group, DistributedDataParallel (under any import
alias), FSDP / fully_shard, deepspeed.initialize, gpuscale.init / setup / wrap, accelerate's
Accelerator, DistributedSampler, horovod's init or torch.multiprocessing.spawn, or reads the
launcher's RANK, LOCAL_RANK or WORLD_SIZE (HF's Trainer starts the group itself); other scripts get
no findings.

How far the rules follow a value: a loader or a counter is followed through assignments, into the
script's own functions and classes it is handed to (`Trainer(model, val_loader)`, then
`self.val_loader`), and from a function's return value to its callers (`gpuscale.lint.calls`
resolves calls by name). A state dict is followed into the script's helpers that save it
(`save_checkpoint(state, is_best)`, `save_on_master(*args, **kwargs)`: `gpuscale.lint.saves`), and GS109
is silenced only by a check of the same batch by the same divisor on the division's path (the same
function, an enclosing one, or one that runs it or that it runs), not by any `% world_size` of the file.
GS107 points at the line that reports the unreduced number (rank 0's
print or log first), and is silent for a counter over a loader without a DistributedSampler (that
number is the whole dataset's). GS103 is silent in a script that replaces the built-in print (the
torchvision references' setup_for_distributed), itself or in a module of its own next to it that it
imports (`util/misc.py`), or whose prints pass `force=` (which only a replaced print takes); a print or
INFO log that includes the rank is a deliberate line from each rank. GS101 reports a loader whose
sampler an option picks (`DistributedSampler(...) if args.dist_eval else SequentialSampler(...)`) by its
plain branch, unless the option says whether the run is distributed at all.

Measured on tests/unit/lint_corpus/realistic (realistic DDP scripts with hand-written truths, which the
rules were refined on) and on tests/unit/lint_corpus/heldout (scripts written afterwards, measured as
they are); the figures are in docs/lint.md and checked by tests/unit/test_lint_precision.py.

Rank guards are understood generously (see `gpuscale.lint.guards`): an enclosing `if` or
conditional whose test mentions the rank or the main process, an earlier `if not is_main: return`,
a function every call of which is guarded (a method's calls resolved through `self.` where they
can be), a `@rank_zero_only` decorator, a test of the process index mp.spawn passes as its target's
first parameter, whatever it is called (`if gpu == 0:`). The function that calls mp.spawn runs once; the function mp.spawn
(or a Process that joins the group) runs is per-rank code, even where the script also calls it directly for
one GPU (`gpuscale.lint.launch`). A distributed-or-not test (`local_rank != -1`,
`rank is not None`) is not a rank guard: it is true on every rank.

The text output groups a rule's findings in one script: the first with its why and fix, every further
one as a line of its own (`path:line:col: GS103 ... (why and fix as above)`).

Silence one finding with a comment on its line (or any line of its statement, for a call spread
over several lines): `# gpuscale: ignore[GS103]` (ids comma separated), or `# gpuscale: ignore`
for every rule there.
"""

from gpuscale.lint.engine import expand, lint_paths, lint_source, select_rules, suppressions
from gpuscale.lint.findings import Finding, Rule, format_findings
from gpuscale.lint.rules import RULE_IDS, RULES

__all__ = ["Finding", "Rule", "format_findings", "RULES", "RULE_IDS", "expand", "lint_paths", "lint_source", "select_rules", "suppressions"]
