"""The math experiment's variants, each as what it changes in ``config.base_config()``: ``offline`` (``tiny`` to
``cpu_epochs``: arithmetic, a decoder trained from scratch), ``maxrl`` (``gpu`` / ``full``: MaxRL's settings) and
``paper`` (``paper_*``: the SERA authors' scripts). ``experiments/math_reasoning/config.py`` chooses among them."""
