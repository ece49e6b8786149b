"""EFPSN's main job as a Flower App: softmax regression in numpy (benchmarks/bench_flower.py)."""
