"""The loader's order: pure functions of sizes, seed, epoch and rank; checkpoints and resume."""
