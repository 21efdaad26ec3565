"""The book's benchmarks: hand-written measuring code, not part of ``transformer_lib``.

Run each benchmark as a module from the repository root (see ``bench/README.md`` for the
exact commands that regenerate every committed ``results/bench_*.json``):

    python -m bench.train_throughput     # training step: ours vs nn.Transformer vs textbook
    python -m bench.fast_setting_quality # validation loss: fp32 vs the trainer's fast setting
    python -m bench.attention_scaling    # attention time and memory against sequence length
    python -m bench.decode               # decoding time with and without the key/value cache

The other modules are the parts the training benchmark is built from: ``train_models`` (the
configurations, the seeded batches and the four models), ``train_steps`` (the timed variants
and their training steps), ``flops`` (the analytic FLOPs model), ``micro`` (micro-benchmarks of
single optimizations) and ``common`` (timing, memory, machine description, JSON output).
The performance appendix (``chapters/09_performance.ipynb``) renders the result files.
"""
