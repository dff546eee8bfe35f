"""Every private name of torch, Lightning, Fabric and numpy that lightning-midepoch uses, listed in one place.

:data:`PRIVATE_NAMES` lists each one with its owner (``"module:Class"`` or ``"module"``): nothing under
``src/lightning_midepoch`` reads, sets, imports or overrides a private name of another package that is not listed
here (``tests/test_private.py`` scans the sources for them, and checks that each name is still where it is listed).
Lightning's names are given under ``lightning.pytorch`` / ``lightning.fabric``; ``pytorch_lightning`` /
``lightning_fabric`` have the same ones. numpy's private names: none are used. Python's own are listed too.

The names the overrides cannot run without are also checked on the live objects when the callback is set up
(:func:`lightning_midepoch._compat.check_supported`): :data:`REQUIRED_ATTRIBUTES` (with the public attributes of
Lightning's private classes they rely on), :data:`TORCH_PRIVATE_NAMES`, and, when the train data fetcher is taken
over, :data:`REQUIRED_FETCHER_ATTRIBUTES` and :data:`REQUIRED_COMBINED_LOADER_ATTRIBUTES`.
"""

from __future__ import annotations

#: Every private name of another package used in ``src/``, by owner, and why.
PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    # the bases of the loop and fetcher overrides (annotations only), and the fetcher of a step that pulls its batches
    "lightning.pytorch.loops.fit_loop": ("_FitLoop",),
    "lightning.pytorch.loops.training_epoch_loop": ("_TrainingEpochLoop",),
    "lightning.pytorch.loops.fetchers": ("_DataFetcher", "_DataLoaderIterDataFetcher"),
    # how a CombinedLoader creates its mode iterator (without starting the loaders' iterators)
    "lightning.pytorch.utilities.combined_loader": ("_SUPPORTED_MODES",),
    "lightning.pytorch.utilities.combined_loader:CombinedLoader": (
        "_iterator",
        "_mode",
        "_limits",
        "_load_state_dicts",
    ),
    "lightning.pytorch.utilities.combined_loader:_ModeIterator": ("_idx",),  # the batch index of its next batch
    "lightning.pytorch.trainer.trainer:Trainer": (
        "_checkpoint_connector",
        "_accelerator_connector",
        "_signal_connector",
    ),
    "lightning.pytorch.trainer.connectors.checkpoint_connector:_CheckpointConnector": ("_loaded_checkpoint",),
    "lightning.pytorch.loops.fit_loop:_FitLoop": (
        "_data_fetcher",
        "_restarting",
        "_combined_loader",
        "_last_train_dl_reload_epoch",
        "_combined_loader_states_to_load",  # the stateful loaders' states, until it gives them
    ),
    "lightning.pytorch.loops.training_epoch_loop:_TrainingEpochLoop": (
        "_batches_that_stepped",
        "_should_accumulate",
        "_num_ready_batches_reached",
        "_should_check_val_fx",
        "_broadcast_sigterm_tensor",  # :data:`SIGTERM_EXCHANGE`
    ),
    # pre-emption: the handlers Lightning registers, and how it composes one signal's handlers
    "lightning.pytorch.trainer.connectors.signal_connector": ("_HandlersCompose",),
    "lightning.pytorch.trainer.connectors.signal_connector:_SignalConnector": (
        "_slurm_sigusr_handler_fn",
        "_sigterm_notifier_fn",
    ),
    # `inspect` reads a checkpoint as Lightning does (local or remote paths, through fsspec)
    "lightning.fabric.utilities.cloud_io": ("_load",),
    # the worker recording: a new iterator (and its workers), persistent workers' iterator, the batches handed out
    "torch.utils.data.dataloader:DataLoader": ("_get_iterator", "_iterator"),
    "torch.utils.data.dataloader:_MultiProcessingDataLoaderIter": ("_process_data", "_send_idx", "_reset"),
    # Python's: how a stock loop object pickles; a named tuple's fields (documented, despite the underscore)
    "copyreg": ("_reconstructor",),
    "collections": ("_fields",),
    # Hugging Face datasets' IterableDataset: its chain of example iterables, the state it loaded (_datalibs)
    "datasets.iterable_dataset:IterableDataset": ("_ex_iterable", "_starting_state_dict"),
}

#: Private attributes used, per object, checked on the live trainer before anything is installed.
REQUIRED_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "trainer": ("_checkpoint_connector", "_accelerator_connector", "_signal_connector"),
    "checkpoint_connector": ("_loaded_checkpoint",),
    "fit_loop": (
        "_data_fetcher",
        "_restarting",
        "_combined_loader",
        "_last_train_dl_reload_epoch",
        "epoch_progress",
        "restarted_mid_epoch",
        "restarted_on_epoch_end",
        "restarted_on_epoch_start",
        "update_restart_stage",
        "restarting",
        "setup_data",
        "load_state_dict",
        "on_advance_start",
        "on_advance_end",
        "reset",
    ),
    "epoch_loop": (
        "_batches_that_stepped",
        "_should_accumulate",
        "_num_ready_batches_reached",
        "_should_check_val_fx",
        "batch_progress",
        "restarted_on_train_batch_end",
        "reset_restart_stage",
        "val_loop",
        "on_run_start",
        "advance",
        "reset",
    ),
    "val_loop": ("increment_progress_to_evaluation_end",),
    # the override that defers the signal handlers it registers, and the handlers it recognises
    # (lightning_midepoch._preemption)
    "signal_connector": (
        "register_signal_handlers",
        "teardown",
        "trainer",
        "received_sigterm",
        "_slurm_sigusr_handler_fn",
        "_sigterm_notifier_fn",
    ),
}

#: The epoch loop's exchange of rank 0's SIGTERM flag at each training batch under DDP (Lightning 2.5.2 and later):
#: the pre-emption code stands in for it on one trainer (lightning_midepoch._preemption.SharedSignalCheck).
SIGTERM_EXCHANGE = "_broadcast_sigterm_tensor"

#: torch's private names the worker recording relies on (listed in :data:`PRIVATE_NAMES` too), checked on
#: torch's classes when the callback is set up: ``"module:Class"`` and the names each must define.
TORCH_PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    "torch.utils.data.dataloader:DataLoader": ("_get_iterator",),
    # `_reset` sets `_send_idx` (read where present: tasks_sent)
    "torch.utils.data.dataloader:_MultiProcessingDataLoaderIter": ("_process_data", "_reset"),
}

#: Private attributes of the train data fetcher (created inside ``setup_data``, checked when it is taken over) and of
#: the ``CombinedLoader`` it iterates.
REQUIRED_FETCHER_ATTRIBUTES = (
    "fetched",
    "iterator",
    "length",
    "done",
    "reset",
    "combined_loader",
)
REQUIRED_COMBINED_LOADER_ATTRIBUTES = ("_iterator", "_mode", "_limits", "flattened")
