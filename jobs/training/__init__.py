"""Training the paper's model variants: one model trained and saved with its card (model.py: jobs.train), and a
study's models, each trained once per model id and reused (study.py: jobs.pipeline's train stage)."""
