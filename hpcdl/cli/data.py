"""``hpcdl data``: generate, check, describe, convert and import the climate and HEP data sets."""

from __future__ import annotations

import argparse
import sys


def _grid(text: str) -> tuple[int, int]:
    try:
        ny, nx = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"grid must look like 96x144 (lat x lon), got {text!r}") from None
    return ny, nx


def register(subparsers) -> None:
    parser = subparsers.add_parser("data", help="generate, verify, describe and convert data sets")
    commands = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    make = commands.add_parser("make", help="generate a climate or HEP data set with its manifest")
    make.add_argument("kind", choices=("climate", "hep"))
    make.add_argument("--samples", type=int, required=True, help="number of snapshots (climate) or jets (hep)")
    make.add_argument("--out", required=True, help="output directory (created)")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--grid", type=_grid, default=None,
                      help="climate grid LATxLON (default 96x144; DeepCAM's is 768x1152)")
    make.add_argument("--no-progress", action="store_true", help="no progress bar")
    make.set_defaults(handler=_make)

    verify = commands.add_parser("verify", help="check a data set's files against its manifest checksums")
    verify.add_argument("dataset", help="directory with a manifest.json, or a committed sample name")
    verify.set_defaults(handler=_verify)

    info = commands.add_parser("info", help="describe a data set (shapes, classes, split sizes)")
    info.add_argument("dataset")
    info.add_argument("--features", choices=("images", "constituents"), default=None, help="HEP input features")
    info.set_defaults(handler=_info)

    bench = commands.add_parser("bench", help="measure how fast a rank's ShardedLoader delivers batches")
    bench.add_argument("dataset")
    bench.add_argument("--features", choices=("images", "constituents"), default=None)
    bench.add_argument("--batch", type=int, default=8)
    bench.add_argument("--prefetch", type=int, default=2)
    bench.add_argument("--world-size", type=int, default=1, help="shard as rank 0 of this many")
    bench.set_defaults(handler=_bench)

    imports = commands.add_parser("import", help="convert a public jet data set into hpcdl's HEP layout")
    imports.add_argument("format", choices=("jetnet", "top-tagging"),
                         help="jetnet: JetNet HDF5 files (g.hdf5, t.hdf5, ...; two or more jet types); "
                              "top-tagging: the Top Quark Tagging Reference Dataset (pandas fixed-format HDF5)")
    imports.add_argument("files", nargs="+", help="the file(s) to import")
    imports.add_argument("--out", required=True, help="output directory (jets.h5 and manifest.json)")
    imports.add_argument("--image-size", type=int, default=32, help="jet image pixels per side (default 32)")
    imports.add_argument("--max-jets", type=int, default=None, help="top-tagging: import only the first N jets")
    imports.set_defaults(handler=_import)

    convert = commands.add_parser("to-deepcam", help="write a climate data set in DeepCAM's HDF5 layout")
    convert.add_argument("dataset", help="climate data set directory or 'climate-sample'")
    convert.add_argument("--out", required=True)
    convert.add_argument("--layout", choices=("per-sample", "single"), default="per-sample",
                         help="per-sample: the MLPerf HPC reference layout (train/, validation/, stats.h5); "
                              "single: one chunked file with a manifest")
    convert.add_argument("--val-fraction", type=float, default=0.2,
                         help="per-sample: the last fraction in time goes to validation/ (default 0.2)")
    convert.add_argument("--no-progress", action="store_true")
    convert.set_defaults(handler=_to_deepcam)


def _make(args) -> int:
    if args.samples < 1:
        raise ValueError(f"--samples must be at least 1, got {args.samples}")
    if args.kind == "climate":
        from hpcdl_datasets.climate import ClimateSettings, generate_climate

        settings = ClimateSettings.for_grid(*args.grid) if args.grid else ClimateSettings()
        manifest = generate_climate(args.out, args.samples, args.seed, settings, progress=not args.no_progress)
    else:
        if args.grid:
            raise ValueError("--grid applies to climate data only")
        from hpcdl_datasets.hep import generate_hep, import_pythia

        try:
            import_pythia()
        except ImportError as err:
            print(f"hpcdl data: error: {err}", file=sys.stderr)
            return 2
        manifest = generate_hep(args.out, args.samples, args.seed, progress=not args.no_progress)
    size = sum(entry["bytes"] for entry in manifest.files)
    print(f"wrote {manifest.count} samples in {len(manifest.files)} files ({size / 2**20:.1f} MiB) and "
          f"{manifest.path}")
    return 0


def _verify(args) -> int:
    from hpcdl.data.datasets import resolve
    from hpcdl.data.manifest import read_manifest, verify_checksums

    manifest = read_manifest(resolve(args.dataset))
    print(f"{manifest.path}: {verify_checksums(manifest)} files match their sha256 checksums")
    return 0


def _info(args) -> int:
    from hpcdl.data import load_dataset

    for split in ("train", "val"):
        data = load_dataset(args.dataset, split, features=args.features)
        x, y = data[0]
        info = data.info
        print(f"{split}: {len(data)} samples of x {tuple(x.shape)} {x.dtype}, y {tuple(y.shape)} {y.dtype}; "
              f"{info['task']}, classes {info['class_names']}")
    print(f"source: {info['source']}")
    return 0


def _bench(args) -> int:
    import time

    from hpcdl.data import ShardedLoader, load_dataset

    data = load_dataset(args.dataset, "all", features=args.features)
    loader = ShardedLoader(data, args.batch, rank=0, world_size=args.world_size, prefetch=args.prefetch)
    began, began_cpu = time.perf_counter(), time.process_time()
    samples = nbytes = 0
    for x, y in loader:
        samples += len(x)
        nbytes += x.numel() * x.element_size() + y.numel() * y.element_size()
    seconds, cpu = time.perf_counter() - began, time.process_time() - began_cpu
    print(f"{args.dataset}: {samples} samples in {len(loader)} batches of {args.batch} (rank 0 of "
          f"{args.world_size}, prefetch {args.prefetch}) in {seconds:.2f} s: {samples / seconds:.0f} samples/s, "
          f"{nbytes / seconds / 2**20:.1f} MiB/s of tensors; {cpu / samples * 1e3:.1f} ms CPU per sample")
    return 0


def _to_deepcam(args) -> int:
    from hpcdl_datasets.climate.deepcam import convert_to_deepcam

    written = convert_to_deepcam(args.dataset, args.out, args.layout, progress=not args.no_progress,
                                 val_fraction=args.val_fraction)
    print(f"wrote {written} ({args.layout} layout)")
    return 0


def _import(args) -> int:
    from hpcdl_datasets.hep.importers import import_jetnet, import_top_tagging

    if args.image_size < 4:
        raise ValueError(f"--image-size must be at least 4, got {args.image_size}")
    if args.format == "jetnet":
        if args.max_jets is not None:
            raise ValueError("--max-jets applies to top-tagging only")
        manifest = import_jetnet(args.files, args.out, image_size=args.image_size)
    else:
        if len(args.files) != 1:
            raise ValueError(f"top-tagging imports one file at a time, got {len(args.files)}")
        manifest = import_top_tagging(args.files[0], args.out, image_size=args.image_size, max_jets=args.max_jets)
    print(f"imported {manifest.count} jets of classes {manifest.class_names} into {manifest.path}")
    return 0
