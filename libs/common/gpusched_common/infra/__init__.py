"""The infrastructure gpusched starts for itself on a bare machine: a Kafka-protocol broker (Tansu or
Apache Kafka) and a private PostgreSQL, each as a process of its own that is stopped by PID."""
