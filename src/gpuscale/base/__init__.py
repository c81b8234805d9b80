"""The base: small records and arithmetic that import nothing of gpuscale.

`files`: atomic writes; `rng`: random states; `exits`: the clean-stop exit; `precision`: dtypes; `wrapped`: what
the wrapped model means for measuring; `batches`: counting a batch's samples; `batchplan`: the exact global batch;
`timeline`: the utilisation timeline's documents; `lifeline`: ending with the parent process.
"""
