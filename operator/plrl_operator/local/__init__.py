"""`plrl run`: the local controller, the operator's twin for one machine.

Same job file, same worker code, same decisions (`policy.decide`); processes instead of API
objects. `runner` observes the job's processes and acts on the decisions, `processes` starts and
stops them, `report` reads the step records back, `status_cli` is `plrl status`.
"""
