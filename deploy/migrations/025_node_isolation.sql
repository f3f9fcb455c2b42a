-- What each node enforces on its jobs (issue 14): cpu, memory, devices, users, environment, each with how
-- or why not (services/node_agent/cgroups.py), as its agent registered it; `gpusched nodes` shows it.
ALTER TABLE nodes ADD COLUMN isolation jsonb NOT NULL DEFAULT '{}'::jsonb;
