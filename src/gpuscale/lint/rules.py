"""The rule table: id, title, why it matters and the fix, next to the function that checks it.

Every rule is only active in a distributed script (`Script.is_distributed`): one that starts a
process group, wraps a model for data parallelism (DDP, FSDP, DeepSpeed), uses gpuscale,
Accelerate or Horovod to do so, or reads the launcher's RANK / WORLD_SIZE. A single-process script
has none of these mistakes.
"""

from __future__ import annotations

from gpuscale.lint import rules_data, rules_deepspeed, rules_metrics, rules_ranks, rules_seeds, rules_setup, rules_spawn
from gpuscale.lint.findings import Rule

RULES: tuple[Rule, ...] = (
    Rule("GS101", "every rank reads the whole dataset",
         "a DataLoader without a DistributedSampler gives every rank the same samples: N GPUs train N copies of "
         "one epoch (no speed-up) and evaluation scores the full set N times",
         "gpuscale.make_loader(dataset, gpuscale.plan_batch(...)) shards it (train=False for evaluation); "
         "or pass sampler=DistributedSampler(dataset)",
         rules_data.check_loader_sampler),
    Rule("GS102", "the same shuffle every epoch",
         "DistributedSampler seeds its shuffle with the epoch number; without sampler.set_epoch(epoch) every epoch "
         "sees the samples in the same order",
         "call sampler.set_epoch(epoch) at the start of every epoch; gpuscale.make_loader reshuffles by itself",
         rules_data.check_set_epoch),
    Rule("GS103", "printed by every rank",
         "N ranks print N copies of every line, interleaved, and the one line that matters is lost in them",
         "gpuscale.print0(...) prints on rank 0 only; or guard it with `if rt.is_main:` (rank == 0)",
         rules_ranks.check_print),
    Rule("GS104", "logged by every rank",
         "a standard-library logger logs INFO on every rank: N copies of every line",
         "log = gpuscale.get_logger(__name__) logs INFO from rank 0 only and warnings from every rank, tagged with "
         "the rank; or guard it with `if rt.is_main:`",
         rules_ranks.check_logging),
    Rule("GS105", "saved by every rank",
         "every rank writes the same file at the same time: a corrupt or half-written checkpoint, N times the I/O",
         "gpuscale.Checkpointer(dir).save(...) writes once, atomically (every rank calls it); or guard the save with "
         "`if rt.is_main:`; save_pretrained(..., is_main_process=rt.is_main)",
         rules_ranks.check_save),
    Rule("GS106", "the DDP wrapper's state_dict is saved",
         "the wrapper's keys all start with 'module.': the checkpoint does not load into the plain model",
         "save gpuscale.full_state_dict(model) (or gpuscale.unwrap(model).state_dict(), model.module.state_dict())",
         rules_ranks.check_wrapper_state_dict),
    Rule("GS107", "metric of one rank's shard",
         "each rank counts only the samples of its own shard (its loader has a DistributedSampler, or is sharded by "
         "a library), and nothing sums the counts over the ranks: the accuracy printed is rank 0's shard's, not the "
         "dataset's",
         "sum the counts over ranks: gpuscale.Average().update(correct, count).compute(), "
         "gpuscale.all_reduce_sum([correct, total]), or torch.distributed.all_reduce; in Lightning, "
         "self.log(name, value, sync_dist=True)",
         rules_metrics.check_metrics_reduced),
    Rule("GS108", "parameters unfrozen after wrapping",
         "DDP, FSDP and DeepSpeed fix the set of trainable parameters when they wrap the model: gradients of "
         "parameters unfrozen later are never synchronised, and the ranks' weights drift apart",
         "unfreeze before wrapping, or wrap again afterwards: gpuscale.setup(model, ...) / gpuscale.wrap(model)",
         rules_setup.check_unfreeze_after_wrap),
    Rule("GS109", "batch divided by the number of ranks",
         "integer division drops the remainder: a global batch of 25 on 2 ranks trains with 2 x 12 = 24, and the "
         "scaling result compares different problems",
         "gpuscale.plan_batch(batch_size, rt.world_size, scaling='strong') gives the exact split or refuses with "
         "the nearest valid sizes; or check batch % world_size == 0",
         rules_data.check_integer_division),
    Rule("GS110", "hard-coded rendezvous port",
         "two jobs on one node (or a port still held by a crashed run) collide on the same port: "
         "'address already in use', or a rank joins the wrong job",
         "let the launcher choose: gpuscale run / torchrun set MASTER_PORT, gpuscale.init() reads it, and "
         "gpuscale's batch scripts derive it from the job id; use init_method='env://'",
         rules_setup.check_master_port),
    Rule("GS111", "hard-coded GPU index",
         "every rank of the node uses the same GPU: they share one device (out of memory, serialised) while the "
         "other GPUs idle",
         "use the local rank's device: `with gpuscale.init() as rt:` and rt.device (or "
         "torch.device('cuda', local_rank))",
         rules_setup.check_device_index),
    Rule("GS112", "process group never destroyed",
         "without destroy_process_group() the process can hang or warn at exit, and NCCL resources leak",
         "`with gpuscale.init() as rt:` starts and always tears down the process group; or call "
         "torch.distributed.destroy_process_group() in a finally block",
         rules_setup.check_destroy),
    Rule("GS113", "DeepSpeed batch disagrees with the loader",
         "train_batch_size is global (micro batch x accumulation x ranks), train_micro_batch_size_per_gpu is per "
         "rank: a config that disagrees with the loader's per-rank batch makes DeepSpeed refuse to start, or "
         "scale the learning rate for a batch that is not the one trained",
         "gpuscale.setup(model, ..., plan=gpuscale.plan_batch(...), strategy='deepspeed') fills both from one plan; "
         "or set train_micro_batch_size_per_gpu to the loader's batch_size",
         rules_deepspeed.check_deepspeed_batch),
    Rule("GS114", "split or shuffled differently on every rank",
         "every rank draws its own random split (or order) when the generator is unseeded or seeded with the rank: "
         "a sample held out for validation on one rank is trained on by another, and the shards overlap and miss "
         "samples",
         "seed it the same on every rank: random_split(data, sizes, generator=torch.Generator().manual_seed(42)), "
         "train_test_split(..., random_state=42), dataset.shuffle(seed=42); then shard with "
         "gpuscale.make_loader(subset, gpuscale.plan_batch(...))",
         rules_seeds.check_unseeded_split),
    Rule("GS115", "global assigned only under __main__, read in a spawned process",
         "processes started by mp.spawn (or the spawn start method) import the script as __mp_main__ and do not run "
         "its `if __name__ == \"__main__\":` block: a name assigned only there does not exist in them (NameError)",
         "pass the value in: mp.spawn(worker, args=(args,)); or assign it at module level; or launch with "
         "`gpuscale run` / torchrun and `with gpuscale.init() as rt:` instead of mp.spawn",
         rules_spawn.check_main_only_globals),
    Rule("GS116", "every rank on the current GPU, never chosen",
         "`.cuda()`, `.to('cuda')` and `device='cuda'` mean the current GPU, which is cuda:0 until the rank chooses "
         "another: every rank of the node computes on GPU 0 (out of memory, or slow and serialised) while the other "
         "GPUs idle",
         "choose each rank's GPU first: `with gpuscale.init() as rt:` and rt.device; or "
         "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before any tensor goes to the GPU",
         rules_setup.check_current_gpu),
)

RULE_IDS = tuple(rule.id for rule in RULES)
