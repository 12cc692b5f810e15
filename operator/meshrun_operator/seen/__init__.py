"""What the operator sees: views of a job's children, the node and relist watches, the
trainer's progress, and the expectations of its own writes not seen yet."""
