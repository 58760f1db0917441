"""The job's coordinator, run by trainer rank 0: prompt leases, rollout intake, accounting, control.

`core.Coordinator` is the state machine (pure: no grpc, no torch); `checks` validates submitted
rollouts; `control` queues control events for generators; `state` is the record a checkpoint keeps
so a restarted trainer neither loses nor repeats a prompt. The wire types it speaks are in
`plrl_workers.protocol`; `rpc/server.py` serves it.
"""
