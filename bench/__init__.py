"""kvedge.bench: generated benchmark tasks (`tasks`), their scoring and prompts, benchmark
datasets, the method x budget runner and its reports."""
