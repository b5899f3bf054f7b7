"""What of nncomm's Python knows nnabla: the graph analysis behind the
backward hook (graph.py) and nnabla's own entry points answered by nncomm
(entry.py). The compiled half is pyx/nnabla_adapter/."""
