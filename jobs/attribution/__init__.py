"""The attribution machinery behind `python -m jobs.attribute` (and jobs.pipeline's attribute stage), one module per
concern; the settings it takes are jobs/config.py's JobSettings.

    prepare.py   stage 0: read, select and validate the pairs (inputs.py, validate.py), load the engine, the run id
    run.py       stages 1-2 wave by wave into the store (compute), the summary and the manifest (attribute)
    stage1.py    the sentence factors of a wave from an actor pool on Ray (FactorStream), the pool's resources
    stage2.py    the pair numbers and cells of a wave (Ray tasks), exactly once, the wave's tables
    placement.py who writes the cells (--cell-writer), decided before each wave from the nodes alive then
    local.py     stages 1-2 in this process, without Ray (--executor local)
    actors.py    FactorActor (stage 1) and PairCells (stage 2): what runs inside Ray's workers
    worklist.py  the pairs to attribute and their keys in memory-mapped files, the wave order
    memory.py    the driver's memory: Arrow's allocator, giving freed memory back, what the driver holds
    inputs.py    pair datasets in: sources, formats, columns, the seeded sample
    validate.py  each selected row good or quarantined, streamed chunk by chunk
    datasets.py  the generated datasets (negation, adjectives)
"""
