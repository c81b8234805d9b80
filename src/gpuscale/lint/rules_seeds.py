"""GS114: data split or shuffled at random, differently on every rank, before it is sharded.

Every rank runs the same script, so a random train/validation split, or a random reordering of the
samples that later decides what each rank reads, must come out the same on every rank. It does when
its generator is seeded with the same number everywhere: `generator=torch.Generator().manual_seed(42)`,
`random_state=0`, `seed=0`, or a global seed set on every rank before it (`torch.manual_seed(0)`,
`random.seed`, `np.random.seed`, a `set_seed` / `seed_everything`, or the script's own helper calling
them). A seed that adds the rank (`seed + rank`, nanoGPT's `1337 + seed_offset`) seeds each rank
differently: it does not count.

Reported: `random_split`, scikit-learn's and HF datasets' `train_test_split` (splits: always decisive),
and `torch.randperm`, `random.shuffle` / `random.sample`, `np.random.shuffle` / `permutation`, an HF
dataset's `.shuffle()` and pandas' `.sample(frac=...)` (shuffles) when what they shuffle is then sliced
(`files[n_val:]`, `files[rank::world]`), selected from (`.shuffle().select(...)`) or handed to a
dataset, sampler or loader. A shuffle of data that is already this rank's share, a mixup permutation
of a batch (`x[torch.randperm(n)]`) and anything that runs on the main rank only are left alone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from gpuscale.lint import calls
from gpuscale.lint.findings import Hit
from gpuscale.lint.guards import Guards, mentions_rank
from gpuscale.lint.rules_data import SHARDING
from gpuscale.lint.script import Script, dotted, keyword, last_name, names_in

TORCH, RANDOM, NUMPY = "torch", "random", "numpy"
ALL_FAMILIES = frozenset({TORCH, RANDOM, NUMPY})
# Global seeding calls and the generator each seeds.
SEEDERS = {"torch.manual_seed": {TORCH}, "torch.random.manual_seed": {TORCH}, "random.seed": {RANDOM},
           "numpy.random.seed": {NUMPY}}
SEED_EVERYTHING = ("set_seed", "seed_everything", "set_random_seed")  # transformers, accelerate, lightning
# Calls that decide which samples a split or a rank gets when handed the shuffled data.
CONSUMERS = frozenset({"Subset", "DataLoader", "DistributedSampler", "split_dataset_by_node", "random_split", "select",
                       "shard", "train_test_split", "from_pandas", "from_dict", "from_list"})
DATASET_KEYWORDS = ("train_dataset", "eval_dataset", "dataset")


@dataclass(frozen=True)
class RandomOp:
    """A random split or shuffle: the call, the generator family it draws from, 'split' or 'shuffle', and
    whether it brings its own seed."""

    call: ast.Call
    family: str
    kind: str
    seeded: bool


def _rank_free(script: Script, exprs: list[ast.AST]) -> bool:
    """Whether seed expressions are the same on every rank: they mention no rank, nor a variable assigned one
    (`seed_offset = ddp_rank`)."""
    for expr in exprs:
        if mentions_rank(expr):
            return False
        for name in {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}:
            if any(mentions_rank(v) for v in script.assignments(name)):
                return False
    return True


def _seeds(call: ast.Call) -> list[ast.AST]:
    """The arguments of a seeding call (the seed, wherever it is passed)."""
    return [*call.args, *(k.value for k in call.keywords)]


def _direct_families(script: Script, call: ast.Call) -> set[str]:
    """The generators a library seeding call seeds (`torch.manual_seed`, `np.random.seed`, `set_seed`...)."""
    qualname = script.qualname(call)
    if qualname in SEEDERS:
        return set(SEEDERS[qualname])
    if last_name(call.func) in SEED_EVERYTHING and calls.callee(script, call) is None:
        return set(ALL_FAMILIES)
    return set()


def _fed_by_parameters(function: ast.AST, call: ast.Call) -> bool:
    """Whether a call's seed comes from the parameters of the function it is in (a seeding helper's inside)."""
    args = function.args  # type: ignore[attr-defined]
    params = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    return any(name in params for e in _seeds(call) for name in names_in(e))


def _helper_families(script: Script, function: ast.AST) -> set[str]:
    """The generators the script's own seeding helper seeds with the seed it is given
    (`def seed_everything(seed): random.seed(seed); np.random.seed(seed); ...`)."""
    return set().union(*(_direct_families(script, n) for n in calls.scope_nodes(script, function)
                         if isinstance(n, ast.Call) and _fed_by_parameters(function, n)))


def seeded_families(script: Script, guards: Guards) -> list[tuple[ast.Call, set[str]]]:
    """The seeding calls that run on every rank with the same seed, and the generators each seeds. A call
    inside the script's own seeding helper counts through the helper's calls instead (their seed decides)."""
    found = []
    for call in script.calls:
        function = calls.callee(script, call)
        families = _helper_families(script, function) if function is not None else _direct_families(script, call)
        if not families or guards.guarded(call):
            continue
        scope = script.scope(call)
        if function is None and isinstance(scope, calls.FUNCTIONS) and _fed_by_parameters(scope, call):
            continue  # inside a helper: its callers' seeds count
        if _rank_free(script, _seeds(call)):
            found.append((call, families))
    return found


def _own_seed(script: Script, call: ast.Call, *names: str, position: int | None = None) -> bool:
    """Whether a call passes its own seed or generator (by keyword, or at `position`) that is the same on every rank."""
    given = [v for v in (keyword(call, n) for n in names) if v is not None]
    if position is not None and len(call.args) > position:
        given.append(call.args[position])
    given = [g for g in given if not (isinstance(g, ast.Constant) and g.value is None)]
    return bool(given) and _rank_free(script, given)


def random_op(script: Script, call: ast.Call) -> RandomOp | None:
    """What kind of random split or shuffle a call is, if it is one."""
    qualname, name, func = script.qualname(call), last_name(call.func), call.func
    module_call = isinstance(func, ast.Attribute) and script.qualname(func.value) in ("random", "numpy.random", "torch")
    if name == "random_split":
        return RandomOp(call, TORCH, "split", _own_seed(script, call, "generator", position=2))
    if name == "train_test_split":
        if isinstance(func, ast.Attribute) and not module_call:  # HF datasets: seed / generator
            return RandomOp(call, NUMPY, "split", _own_seed(script, call, "seed", "generator"))
        return RandomOp(call, NUMPY, "split", _own_seed(script, call, "random_state"))
    if qualname == "torch.randperm":
        return RandomOp(call, TORCH, "shuffle", _own_seed(script, call, "generator"))
    if qualname in ("random.shuffle", "random.sample"):
        return RandomOp(call, RANDOM, "shuffle", False)
    if qualname in ("numpy.random.shuffle", "numpy.random.permutation"):
        return RandomOp(call, NUMPY, "shuffle", False)
    if isinstance(func, ast.Attribute) and not module_call:
        if name == "shuffle" and not call.args:  # HF datasets; webdataset's .shuffle(1000) takes a buffer size
            return RandomOp(call, NUMPY, "shuffle", _own_seed(script, call, "seed", "generator"))
        if name == "sample" and keyword(call, "frac") is not None:  # pandas
            return RandomOp(call, NUMPY, "shuffle", _own_seed(script, call, "random_state"))
    return None


def _shuffled_names(script: Script, op: RandomOp) -> set[str]:
    """The variables holding the shuffled data: the list shuffled in place, or the names assigned the result."""
    call = op.call
    if script.qualname(call) in ("random.shuffle", "numpy.random.shuffle") and call.args:
        return {n for n in [dotted(call.args[0])] if n}
    stmt = script.statement(call)
    if isinstance(stmt, ast.Assign):
        return {d for t in stmt.targets for d in [dotted(t)] if d}
    return set()


def _consumes(script: Script, node: ast.Call, name: str) -> bool:
    """Whether a call hands the data named `name` to something that decides which samples go where."""
    callee = script.callee(node)
    if callee in CONSUMERS or callee.endswith(("Dataset", "Sampler", "Loader")):
        return any(dotted(n) == name for a in [*node.args, *(k.value for k in node.keywords)] for n in ast.walk(a))
    return any(k.arg in DATASET_KEYWORDS and any(dotted(n) == name for n in ast.walk(k.value)) for k in node.keywords)


def _decides_samples(script: Script, op: RandomOp) -> bool:
    """Whether a shuffle's result later decides a split or a rank's share: a selection chained on it, or its
    variable sliced or handed to a dataset, sampler or loader after it, in the same function."""
    parent = script.parent(op.call)
    if isinstance(parent, ast.Attribute) and parent.attr in ("select", "shard", "train_test_split", "take"):
        return True
    names = _shuffled_names(script, op)
    scope = script.scope(op.call)
    for node in calls.scope_nodes(script, scope):
        if getattr(node, "lineno", 0) <= op.call.lineno:
            continue
        for name in names:
            if isinstance(node, ast.Subscript) and dotted(node.value) == name and isinstance(node.slice, ast.Slice):
                return True
            if isinstance(node, ast.Call) and _consumes(script, node, name):
                return True
    return False


def _already_sharded(script: Script, op: RandomOp, depth: int = 2) -> bool:
    """Whether what is shuffled is already this rank's share: it, or a variable (or `self.x`) it is computed
    from, a few assignments back, mentions ranks or shards (`ids = list(self.ids)`, `self.ids = ids[rank::world]`)."""
    call = op.call
    exprs: list[ast.AST] = [*call.args]
    if isinstance(call.func, ast.Attribute):
        exprs.append(call.func.value)
    seen: set[str] = set()
    for _ in range(depth + 1):
        if any(SHARDING.search(word) for e in exprs for word in names_in(e)):
            return True
        variables = {d for e in exprs for n in ast.walk(e) if (d := dotted(n)) and d not in seen}
        seen |= variables
        exprs = [v for name in variables for v in script.assignments(name)]
    return False


def _seeded_before(script: Script, seeding: ast.Call, node: ast.AST, depth: int = 3) -> bool:
    """Whether a seeding call runs before `node`: at module level, earlier in the same function, or earlier in
    a function that calls (directly or through a few calls) the function `node` is in."""
    seed_scope, scope = script.scope(seeding), script.scope(node)
    if scope is seed_scope:
        return seeding.lineno < node.lineno  # type: ignore[attr-defined]
    if seed_scope is script.tree:
        return True
    if depth == 0 or not isinstance(scope, calls.FUNCTIONS):
        return False
    return any(_seeded_before(script, seeding, site, depth - 1) for site in calls.call_sites(script, scope))


def _globally_seeded(script: Script, op: RandomOp, seedings: list[tuple[ast.Call, set[str]]]) -> bool:
    """Whether a same-on-every-rank global seed of the op's generator runs before it."""
    return any(op.family in families and _seeded_before(script, call, op.call) for call, families in seedings)


def check_unseeded_split(script: Script) -> Iterator[Hit]:
    """GS114: a random split, or a shuffle that decides what each rank or split gets, seeded differently on each rank."""
    guards = Guards(script)
    seedings: list[tuple[ast.Call, set[str]]] | None = None
    for call in script.calls:
        op = random_op(script, call)
        if op is None or op.seeded or guards.guarded(call):
            continue
        if op.kind == "shuffle" and (not _decides_samples(script, op) or _already_sharded(script, op)):
            continue
        if seedings is None:
            seedings = seeded_families(script, guards)
        if _globally_seeded(script, op, seedings):
            continue
        what = dotted(call.func) or f".{last_name(call.func)}"
        if op.kind == "split":
            yield Hit(call, f"{what}() splits the data with an unseeded (or per-rank) generator: "
                            "each rank draws its own split")
        else:
            yield Hit(call, f"{what}() reorders the data before it is split or sharded with an unseeded (or per-rank) "
                            "generator: each rank gets another order")
