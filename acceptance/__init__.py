"""Fresh-process SIGKILL acceptance suite, run against every durable store."""
