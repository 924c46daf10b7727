"""What every LightningModule of the toolkit shares: an encoder that owns the item table, the
output head beside it, a sampler rebuilt from that table, the strategy that draws negatives from
it, a softmax objective, the optimiser, and metric logging."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import lightning as L
import torch
import torchmetrics
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor, nn

from recsys_midx.distributed import broadcast_module_state, raise_on_every_rank
from recsys_midx.heads import Head, HeadOutput, optimizer_param_groups
from recsys_midx.lit.table_optimizers import (
    TABLE_OPTIMIZERS,
    TableAndDenseOptimizer,
    TableNeeds,
    build_table_optimizer,
    check_table_optimizer,
    default_table_lr,
)
from recsys_midx.negatives import Negatives, NoNegatives, PerQuery, QueryBatch
from recsys_midx.protocols import (
    CatalogDataModule,
    NegativeSampler,
    NegativesStrategy,
    Objective,
    RefreshableIndex,
)
from recsys_midx.scoring import RankingQueries, ranking_queries

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


class CatalogModule(L.LightningModule, abc.ABC):
    """Base of the modules that train an encoder with a (sampled) softmax over its item table.

    The encoder turns a batch into query vectors, the head (beside it) turns them into the scaled
    queries of the model's softmax (:class:`~recsys_midx.heads.HeadOutput`), the negatives
    strategy draws the batch's negatives from the sampler's proposal
    (:class:`~recsys_midx.negatives.Negatives`), and the objective scores the queries against the
    item table with them. Evaluation, inference and the diagnostics ask this module
    (:meth:`ranking_queries`, :meth:`proposal_queries`) or its head, never the objective.

    It builds the sampler (and a ``refreshable`` objective) from the live item table when
    fitting starts (not when a run resumes: the checkpoint holds the proposal the interrupted run
    used), exposes :meth:`refresh_sampler` and :meth:`proposal_queries` for
    :class:`~recsys_midx.lit.callbacks.SamplerRefresh`, builds the optimiser, and runs validation
    and test through :meth:`update_metrics`, logging each accumulator's results as ``val/NAME``
    and ``test/NAME`` at the end of the epoch.

    Subclasses implement :meth:`training_step`, :meth:`encode` and :meth:`update_metrics`.

    Args:
        encoder: turns a batch into query vectors and owns the item table (``item_table``).
        head: the output head; its ``temperature`` scales the queries the objective and the
            sampler see.
        sampler: the proposal negatives are drawn from; ``None`` where the strategy draws from
            none (the exact softmax, ``NoNegatives``).
        loss: the objective; it must accept ``head`` (``loss.accepted_heads``) and the scope of
            the strategy's negatives (``loss.scopes``).
        optimizer: a callable building the optimiser from parameters (e.g. a partial
            ``torch.optim.Adam``).
        metrics: the evaluation accumulator; validation uses it, test a fresh copy.
        table_optimizer: ``None`` (the item table is one of the dense optimiser's parameters),
            or one of :data:`~recsys_midx.lit.table_optimizers.TABLE_OPTIMIZERS`: the
            encoder's tables (``encoder.use_sparse_gradients()``) then get sparse gradients
            (only the rows a step reads) and their own row-wise optimiser, stepped with the
            dense one (:class:`~recsys_midx.lit.table_optimizers.TableAndDenseOptimizer`).
        table_lr: the table optimiser's learning rate; ``None``:
            :func:`~recsys_midx.lit.table_optimizers.default_table_lr` (the dense optimiser's
            for lazy Adam, a larger one for row-wise AdaGrad).
        negatives: the strategy drawing each batch's negatives; ``None``:
            :class:`~recsys_midx.negatives.PerQuery` with a sampler, else
            :class:`~recsys_midx.negatives.NoNegatives` (the exact softmax).

    Raises:
        TypeError: if ``loss`` does not accept ``head`` (e.g. ``head=mos`` with ``loss=edrep``).
        ValueError: if ``loss`` does not score the strategy's negatives, the strategy draws from
            a sampler and none is given, reads training sequences the module's batches do not
            hold (:attr:`reads_windows`), or ``table_optimizer`` is unknown.
        ConfigError: if ``table_optimizer`` is set for the exact softmax (which reads every
            row); when fitting starts, with gradient clipping, weight decay or NCCL across
            processes, none of which a sparse update can serve (one line from
            :func:`~recsys_midx.lit.table_optimizers.sparse_update_conflict`).

    Example:
        >>> class PointModule(CatalogModule):
        ...     def encode(self, batch):
        ...         return self.encoder(batch["x"])
        ...     def training_step(self, batch, batch_idx):
        ...         return self.objective(self.encode(batch), batch["y"])
        ...     def update_metrics(self, metrics, batch):
        ...         queries, log_weights, transform = self.ranking_queries(self.encode(batch), 8192)
        ...         metrics.update(target_ranks(queries, self.encoder.item_table, batch["y"],
        ...                                     log_weights=log_weights, transform=transform))
    """

    #: Whether its training batches hold sequences (windows) a negatives strategy may read:
    #: draws per sequence, ``exclude_window``. Only sequential recommendation's do.
    reads_windows: ClassVar[bool] = False

    def __init__(
        self,
        encoder: nn.Module,
        head: Head,
        sampler: NegativeSampler | None,
        loss: Objective,
        optimizer: OptimizerFactory,
        metrics: torchmetrics.Metric,
        table_optimizer: str | None = None,
        table_lr: float | None = None,
        *,
        negatives: NegativesStrategy | None = None,
    ) -> None:
        if negatives is None:
            negatives = NoNegatives() if sampler is None else PerQuery()
        if negatives.needs_windows and not self.reads_windows:
            raise ValueError(
                f"negatives={negatives.name} reads each batch's training sequences: it needs "
                "task=seqrec"
            )
        if table_optimizer is not None and table_optimizer not in TABLE_OPTIMIZERS:
            raise ValueError(
                f"task.module.table_optimizer={table_optimizer}: choose null or "
                f"{' or '.join(TABLE_OPTIMIZERS)}"
            )
        exact_softmax = negatives.scope == "catalog" and loss.exact_on_catalog
        check_table_optimizer(table_optimizer, TableNeeds(exact_softmax))
        if not isinstance(head, loss.accepted_heads):
            accepted = ", ".join(f"head={kind.name}" for kind in loss.accepted_heads)
            raise TypeError(
                f"head={head.name} cannot be used with loss={loss.name}: it takes {accepted}"
            )
        if negatives.scope not in loss.scopes:
            raise ValueError(
                f"loss={loss.name} does not score negatives={negatives.name}: its negatives are "
                f"of scope {negatives.scope}"
            )
        if negatives.uses_sampler and sampler is None:
            raise ValueError(f"negatives={negatives.name} draws from a sampler: give one")
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.sampler = sampler
        self.negatives = negatives
        self.loss = loss
        self.optimizer_factory = optimizer
        self.table_optimizer = table_optimizer
        self.table_lr = table_lr
        self.sparse_tables: list[nn.Parameter] = (
            [] if table_optimizer is None else encoder.use_sparse_gradients()
        )
        self.val_metrics = metrics
        self.test_metrics = metrics.clone()

    @property
    def indexes(self) -> list[RefreshableIndex]:
        """What is built from the item table and rebuilt with it: the sampler (where there is
        one), and the objective when it declares itself ``refreshable`` (EDRep's cluster
        statistics)."""
        built = [] if self.sampler is None else [self.sampler]
        return [*built, self.loss] if self.loss.refreshable else built

    def on_fit_start(self) -> None:
        # A resumed run restores the sampler from its checkpoint: rebuilding it here would give
        # a different proposal from the one the interrupted run was using.
        if self.trainer.ckpt_path is None:
            self.refresh_sampler()

    @torch.no_grad()
    def refresh_sampler(self) -> None:
        """Rebuild the sampler (and a refreshable objective, see :attr:`indexes`) from the live
        item table and the training item counts.

        In a multi-process run rank 0 builds the index and broadcasts it, so every rank draws
        from one proposal even where index building is not bit-reproducible (threaded or GPU
        k-means); the other ranks skip the build. The counts cover the whole training set on
        every rank: the data module holds the full split and only its loaders shard.
        """
        error: Exception | None = None
        if self.trainer.is_global_zero:
            datamodule: CatalogDataModule | None = self.trainer.datamodule
            try:
                self.rebuild_indexes(None if datamodule is None else datamodule.item_counts)
            except Exception as exc:  # re-raised below, on every rank
                error = exc
        raise_on_every_rank(error)
        for module in self.indexes:
            broadcast_module_state(module, src=0)

    @torch.no_grad()
    def rebuild_indexes(self, item_counts: Tensor | None) -> None:
        """Rebuild :attr:`indexes` from the live item table and ``item_counts``, in this process
        alone (:meth:`refresh_sampler` is the trainer's way, building once for every rank).

        Args:
            item_counts: ``[N + 1]`` training count of each item id, moved to the module's
                device; ``None`` where the data gives none.
        """
        table = self.encoder.item_table.detach().float()
        counts = None if item_counts is None else item_counts.to(self.device)
        for module in self.indexes:
            module.update(table, counts)

    @abc.abstractmethod
    def encode(self, batch: dict[str, Any]) -> Tensor:
        """The query vector ``[B, D]`` of each evaluation point of ``batch`` (unscaled)."""

    @abc.abstractmethod
    def update_metrics(self, metrics: torchmetrics.Metric, batch: dict[str, Any]) -> None:
        """Score an evaluation batch against the whole catalog and add it to ``metrics``."""

    @torch.no_grad()
    def proposal_queries(self, batch: dict[str, Any]) -> Tensor:
        """The scaled queries ``z`` the sampler sees for an evaluation batch (dropout off).

        Args:
            batch: an evaluation batch, on any device.

        Returns:
            ``[B, D]`` float32 queries divided by the head's temperature (``[B*K, D]`` for a
            head with ``K`` queries per point), on the module's device.
        """
        batch = move_data_to_device(batch, self.device)
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            queries = self.encode(batch)
        finally:
            self.encoder.train(was_training)
        # Through the head: MoE's projected query, or MoS's K component queries per point.
        return self.head.sampler_queries(queries.float())

    @torch.no_grad()
    def ranking_queries(self, query: Tensor, chunk_size: int) -> RankingQueries:
        """Queries (and mixture log-weights) that rank the catalog as the model does.

        The head decides (:func:`~recsys_midx.scoring.ranking_queries`): the query itself for the
        dot product and for increasing logit transforms, the projected query for MoE, component
        queries and log-weights for MoS (with the transform for MoS with PLIF).

        Args:
            query: ``[B, D]`` encoder outputs.
            chunk_size: items scored at once where the head needs catalog normalisers.

        Returns:
            :class:`~recsys_midx.scoring.RankingQueries` for
            :func:`~recsys_midx.metrics.target_ranks` and :func:`~recsys_midx.metrics.top_labels`.
        """
        return ranking_queries(self.head, query, self.encoder.item_table, chunk_size)

    def draw_negatives(
        self,
        query: Tensor,
        targets: Tensor,
        windows: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> tuple[HeadOutput, Negatives]:
        """The head's output for encoder outputs ``query`` and the negatives the strategy draws
        for it from the sampler: what :meth:`objective` scores, and what a diagnostic of the
        training negatives inspects (:mod:`recsys_midx.analysis.topics`).

        Args:
            query: ``[Q, D]`` encoder outputs.
            targets: ``[Q]`` target ids, or ``[Q, P]`` positives padded with ``0``.
            windows: ``[B, W]`` the batch's training sequences (sequences only).
            positions: ``[B, L]`` mask of the query positions in them (sequences only).

        Returns:
            ``(output, negatives)``.
        """
        output: HeadOutput = self.head(query)
        num_items = self.encoder.item_table.shape[0] - 1
        batch = QueryBatch(output.queries, targets, windows, positions, num_items)
        return output, self.negatives(batch, self.sampler, self.loss.corrects_by_log_q)

    def objective(
        self,
        query: Tensor,
        targets: Tensor,
        windows: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """The training loss of encoder outputs ``query`` ``[Q, D]`` and their positives: the
        head's output scored by the objective against the item table with the negatives the
        strategy draws from the sampler (arguments as for :meth:`draw_negatives`)."""
        output, negatives = self.draw_negatives(query, targets, windows, positions)
        return self.loss(output, targets, self.encoder.item_table, negatives)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.update_metrics(self.val_metrics, batch)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.update_metrics(self.test_metrics, batch)

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val", self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test", self.test_metrics)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # Heads with their own learning rate (PLIF's slopes) get their own parameter group.
        groups = optimizer_param_groups(self)
        if self.table_optimizer is None:
            return self.optimizer_factory(groups)
        tables = {id(table) for table in self.sparse_tables}
        dense = self.optimizer_factory(
            [
                {**group, "params": [p for p in group["params"] if id(p) not in tables]}
                for group in groups
            ]
        )
        check_table_optimizer(self.table_optimizer, self._table_needs(dense))
        lr = (
            default_table_lr(self.table_optimizer, dense.defaults["lr"])
            if self.table_lr is None
            else self.table_lr
        )
        return TableAndDenseOptimizer(
            dense, build_table_optimizer(self.table_optimizer, self.sparse_tables, lr)
        )

    def _table_needs(self, dense: torch.optim.Optimizer) -> TableNeeds:
        """What this run asks of the sparse tables' update, read from the trainer, the dense
        optimizer and the process group (the checks the module can make without a config)."""
        decay = next((g["weight_decay"] for g in dense.param_groups if g.get("weight_decay")), 0.0)
        trainer = self._trainer  # None when the optimizers are built outside a Trainer
        clip = None if trainer is None else trainer.gradient_clip_val
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        nccl = (
            distributed
            and torch.distributed.get_world_size() > 1
            and torch.distributed.get_backend() == "nccl"
        )
        return TableNeeds(False, clip, decay, nccl=nccl)

    def _log_metrics(self, prefix: str, metrics: torchmetrics.Metric) -> None:
        self.log_dict(
            {f"{prefix}/{name}": value for name, value in metrics.compute().items()},
            prog_bar=prefix == "val",
        )
        metrics.reset()
