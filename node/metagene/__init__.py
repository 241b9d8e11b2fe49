"""The METAGENE-1 workload: metagenomic reads in, a genomic foundation model out. One job per module:

- ``reads``: streamed FASTQ/FASTA (plain or gzip; a file, a directory or a glob) through dnaio,
  with hostile-input checks whose errors name the file and line (or record); per-read source.
- ``filtering``: quality-aware filtering (length, N fraction, mean Phred) and bounded exact dedup.
- ``synthetic``: a seeded generated metagenome (organisms of distinct composition, reads with
  errors) for tests, the bench and ``metagene synth``.
- ``tokenizer``: the BPE tokenizer (vocabulary 1024, METAGENE-1's specials), HF layout, bp/token.
- ``genomes``: real genomes from installed packages, the organisms of an offline metagenome
  (or generated ones: ``synthetic`` or ``genic``).
- ``genic``: generated genomes of genes: protein families shared across organisms, each
  organism's codon usage (where more data keeps teaching a model, unlike order-2 genomes).
- ``build``: reads -> tokenizer and reads -> tokenized store (``metagene tokenizer``, ``metagene store``).
- ``digest``: the content hash of a tokenized store, which the DiLoCo peers of one run must share.
- ``job``: the ``[metagene]`` config section: which reads a DiLoCo node pretrains on.
- ``prepare``: a node's tokenized store for ``join --role diloco --workload metagene``, built once.
- ``dataset``: tokenized reads in flat arrays, addressable by index, saved memory-mapped;
  content-keyed held-out split.
- ``sequences``: read -> training item (<= 512 tokens + EOS), packing, the document mask.
- ``sharding``: which reads a peer trains on in a round: a keyed permutation of (seed, round, peer);
  for elastic DiLoCo peers (no rank), a block of the round's permutation chosen by the peer's key.
- ``feed``: a peer's batches for a round (``peer_step_batch`` is what the DiLoCo role's
  ``metagene:store=DIR`` data calls).
- ``presets``: the Llama-shaped presets (node/diloco/llama.py), tiny to the METAGENE-1 7B configuration.
- ``loss``: cross entropy plus z-loss 2e-4.
- ``recipe``: METAGENE-1's numbers for DiLoCo's AdamW recipe (warm-up, cosine to a floor, clipping).
- ``workload``: the workload DiLoCo runs (node/diloco/workload.py): these presets, the
  ``metagene:store=DIR`` data spec, a peer's reads and loss; registered on import.
- ``pretrain``: the inner training step and a one-machine loop; HF-layout saving.
- ``probe``: linear probe and multi-class MCC.
- ``evaluate``: per-organism perplexity, probe MCC on embeddings vs a 4-mer baseline.

specs/metagene.md states the tokenizer layout, sequence format, mask and sharding function.
"""
