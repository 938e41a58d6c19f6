"""The outer face: the `planner` command line (app, registry, plan, explain, frontier) and what it shows people (report, plots). The library never imports this package."""
