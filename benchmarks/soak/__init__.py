"""The soak: hours of mixed, hostile load against a real server, with every check a verdict
(`python -m benchmarks.soak`; the phases and the checks in __main__.py, docs/soak.md).

    __main__.py  the run: phases, schedule, summary          traffic.py  the calls and their records
    fuzz.py      hostile requests and the codes they may get  server.py   the server process, memory, drain
    checks.py    the verdicts                                 report.py   the markdown report and the plot
"""
