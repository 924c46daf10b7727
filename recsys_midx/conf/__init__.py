"""The Hydra configs of the project (``config.yaml`` and one folder per config group)."""
