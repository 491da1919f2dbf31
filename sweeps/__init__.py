"""Sweeps of `launch.train`: one flag's values times seeds, run side by side, resumed where they stopped, and
compared over seeds. `python -m launch.compare` is the entry point; `grid` plans and checks the runs, `records` keeps
each run's state on disk, `runner` runs them, `stats` summarizes them and `plots` draws them."""
