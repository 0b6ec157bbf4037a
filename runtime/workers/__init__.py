"""``workers = N``: N PoP processes serving one port and one data dir.

    primary (the parent: `primary`)  holds DATA/pop.lock, reserves the ports, runs the
    │                                 model worker, restarts a worker that dies, drains
    │                                 all on SIGTERM, writes DATA/pop.json
    ├─ worker 0 (the admin worker)   serves requests + the admin API; after each change
    │                                 it saved, tells the others over `control` and waits;
    │                                 a scrape asks them for their metrics (`control`);
    │                                 their events reach its ring (`events`)
    └─ worker 1..N-1                 serve requests; follow the saved records when told;
                                      forward their events to worker 0

Each worker is a whole PoP (`runtime.app.running_worker`) on the public port with
SO_REUSEPORT, so the kernel spreads connections across them.
"""
