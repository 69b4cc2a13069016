"""scripts/bench_cluster.py's parts: the processes it starts (procs, etcd, servers), how it
talks to them (client), watches them (watch) and reports (report), and one module per phase
(convergence, forwarding, node_loss, leader_kill, etcd_writes, hit_ratio), each a `run`."""
