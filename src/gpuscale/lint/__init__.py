"""`gpuscale lint`: find the classic multi-GPU mistakes in a PyTorch training script, before it runs.

The linter reads the script (the standard library's `ast`; nothing is imported or executed) and
reports, for a script that runs as several processes, each line that will misbehave on more than
one GPU: what is wrong, why it matters, and the gpuscale call that does it right.

    from gpuscale.lint import lint_paths, lint_source
    for finding in lint_paths(["train.py"]):
        print(finding.format())

Rules (each a small function in rules_data, rules_ranks, rules_setup, rules_deepspeed; table in
`gpuscale.lint.rules`):

    GS101  DataLoader without a DistributedSampler: every rank reads (or evaluates) the whole dataset
    GS102  DistributedSampler, but set_epoch() never called: the same shuffle every epoch
    GS103  print() on every rank (no rank guard)
    GS104  standard-library INFO logging on every rank (gpuscale.get_logger filters by rank itself)
    GS105  torch.save / save_pretrained (without is_main_process=) on every rank
    GS106  the DDP wrapper's state_dict() saved: every key starts with 'module.'
    GS107  accuracy-like counters of one rank's shard, never reduced over the ranks
    GS108  parameters unfrozen (requires_grad = True) after DDP/FSDP/DeepSpeed/gpuscale wrapped the model
    GS109  batch // world_size (or int(batch / world_size)): the remainder silently dropped
    GS110  hard-coded MASTER_PORT, or a tcp://host:PORT init_method
    GS111  hard-coded GPU index: "cuda:0", .cuda(0), set_device(0), device_ids=[0]
    GS112  init_process_group() without destroy_process_group()
    GS113  DeepSpeed config batch sizes that disagree with the DataLoader's per-rank batch

A script is distributed when it calls init_process_group, DistributedDataParallel, FSDP /
fully_shard, deepspeed.initialize, gpuscale.init / setup / wrap, accelerate's Accelerator,
DistributedSampler, horovod's init or torch.multiprocessing.spawn; other scripts get no findings.

Rank guards are understood generously (see `gpuscale.lint.guards`): an enclosing `if` or
conditional whose test mentions the rank or the main process, an earlier `if not is_main: return`,
a function every call of which is guarded (a method's calls resolved through `self.` where they
can be), a `@rank_zero_only` decorator. A distributed-or-not test (`local_rank != -1`,
`rank is not None`) is not a rank guard: it is true on every rank.

Silence one finding with a comment on its line (or any line of its statement, for a call spread
over several lines): `# gpuscale: ignore[GS103]` (ids comma separated), or `# gpuscale: ignore`
for every rule there.
"""

from gpuscale.lint.engine import expand, lint_paths, lint_source, select_rules, suppressions
from gpuscale.lint.findings import Finding, Rule
from gpuscale.lint.rules import RULE_IDS, RULES

__all__ = ["Finding", "Rule", "RULES", "RULE_IDS", "expand", "lint_paths", "lint_source", "select_rules", "suppressions"]
