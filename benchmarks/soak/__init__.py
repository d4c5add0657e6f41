"""The soak: hours of mixed, hostile load against a real server, with every check a verdict
(`python -m benchmarks.soak`; the schedule in __main__.py, docs/soak.md).

    __main__.py  the run, its summary and flags      phases.py        the mix, large requests, main load
    record.py    the codes each call may get         traffic.py       the gRPC calls
    fuzz.py      hostile gRPC requests               extreme.py       extreme but valid decoding settings
    http_traffic.py  the three HTTP APIs             http_hostile.py  hostile HTTP on raw connections
    probes.py    periodic gRPC / HTTP health checks  server.py        the server process, memory, drain
    checks.py    the verdicts                        report.py        the markdown report and the plot
"""
