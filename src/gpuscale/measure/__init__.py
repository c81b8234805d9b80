"""Measurement layer: watching a training run without slowing it.

`metrics`: the `Meter` (throughput, the time split, the summary); `probe`: the same account for unchanged
scripts, loaded in every rank before the script; `syncprobe`: replayed steps that time the synchronisation;
`stepsplit`: the step split into its parts; `monitor` and `gpu_samplers`: utilisation, memory and power;
`device_waits`: the calls in a step that wait for the GPU.
"""
