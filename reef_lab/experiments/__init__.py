"""Experiments: a task stream (or a search, or a discovery loop) driven through the gateway in-process, so an offline
run and live traffic exercise one code path. driver.py holds what every family shares; weights.py is the weight
recipes' family; recipes/gepa and recipes/tttd bring their own on the same driver."""
