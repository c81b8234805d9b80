"""Integration layer: foreign trainers on gpuscale's runtime, and one resumable loop over epochs.

`hf`: the HF Trainer placed, measured and stopped by gpuscale (callbacks, its arguments from a plan); `epochs`:
`EpochLoop`, which joins training, checkpoints and stop signals into a loop that resumes mid-epoch.
"""
