"""Parallelism: process groups and the DeviceMesh, DDP / FSDP2 / TP, pipeline stages and
schedules."""
