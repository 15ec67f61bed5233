"""Document permissions pushed down into each engine (issue 43): a store made by the engine's own client holds six
"hr" rows, the best matches for the question, beside rows for eng, for bob, for carol and for everyone. A caller
gets k rows it may read, and the engine itself (its client's own search, watched, not mocked) never sends back a
row the caller may not read; a caller who reads everything, or a source without `readers_field`, sees what it did
before."""

from __future__ import annotations

import pytest

from gradfuse.access import InvalidReader, may_read

QUESTION = "How are salaries reviewed and paid through payroll?"
HR = [f"hr{i}" for i in range(6)]
# (id, text, readers): None is no readers at all (a missing key where the engine has missing keys). Every row shares
# a word with the question, so that full-text search too finds k readable rows.
ROWS = [(f"hr{i}", text, ["hr"] if i % 2 else ["hr", "alice"]) for i, text in enumerate([
    "Salaries are reviewed every April and paid through payroll on the last working day.",
    "Payroll pays each salary monthly; salary reviews follow the yearly appraisal.",
    "The salary review sets each band's pay; payroll applies it from the next month.",
    "Overtime is paid through payroll with the salary of the following month.",
    "Salary advances are requested from payroll and repaid from later salaries.",
    "Bonuses are reviewed with salaries and paid through the same payroll run.",
])] + [
    ("eng0", "The build pipeline runs the unit tests before a merge is reviewed.", ["eng"]),
    ("eng1", "Code review needs one approval from another engineer.", ["eng", "ops"]),
    ("bob0", "Bob's notes on the deploy checklist, reviewed for each release.", ["bob"]),
    ("open0", "The office kitchen is cleaned on Fridays by cleaners the agency has paid.", None),
    ("open1", "Visitors sign in at the front desk; parking is paid at the gate.", None),
    ("open2", "The library lends books for three weeks; late fees are paid at its desk.", []),
    ("carol0", "Carol's draft of the travel policy, reviewed by finance.", ["carol"]),
]
YEAR = {row_id: 2023 + n % 2 for n, (row_id, _, _) in enumerate(ROWS)}  # for a static filter beside the readers
BOB = frozenset({"bob", "eng"})
ALICE = frozenset({"alice", "hr"})
NOBODY = frozenset({"nobody"})
READABLE_TO_BOB = {"eng0", "eng1", "bob0", "open0", "open1", "open2"}
OPEN = {"open0", "open1", "open2"}


@pytest.fixture(scope="module")
def vectors():
    from gradfuse.embedding.encoder import load_encoder

    return load_encoder("all-MiniLM-L6-v2").encode([text for _, text, _ in ROWS]).tolist()


def _watch(monkeypatch, owner, method: str, ids_of) -> list:
    """Wrap `owner.method` (the engine client's own search) to keep what each call was sent and the ids the engine
    returned: [(kwargs, ids), ...]."""
    real, calls = getattr(owner, method), []

    def watched(*args, **kwargs):
        found = real(*args, **kwargs)
        calls.append((kwargs, ids_of(found)))
        return found

    monkeypatch.setattr(owner, method, watched)
    return calls


def _assert_pushed_down(source, calls: list, *, everyone: set[str] = OPEN) -> None:
    """What each engine must do alike, `calls` filled by `_watch` on its search."""
    found = source.search(QUESTION, 5, readers=BOB)
    ids = [c.doc_id for c in found]
    assert len(ids) == 5 and not set(ids) & set(HR) and set(ids) <= READABLE_TO_BOB, ids
    assert all(may_read(c.readers, BOB) for c in found)
    assert any(c.readers for c in found)  # Candidate.readers is filled from the engine's field
    returned = [row for _, rows in calls for row in rows]
    assert returned and not set(returned) & set(HR) and "carol0" not in returned  # filtered inside the engine

    first = [c.doc_id for c in source.search(QUESTION, 5, readers=ALICE)]
    assert set(first) <= set(HR), first  # hr's own rows, the best matches, come first for hr
    everything = [c.doc_id for c in source.search(QUESTION, 5)]
    assert set(everything) <= set(HR)  # a caller who reads every document: as before
    assert {c.doc_id for c in source.search(QUESTION, len(ROWS), readers=NOBODY)} == everyone

    calls.clear()
    with pytest.raises(InvalidReader):  # refused before any filter is written
        source.search(QUESTION, 5, readers=frozenset({"x') OR 1=1 --"}))
    assert not calls


def _assert_static_filter_kept(source, calls: list) -> None:
    """`filter` matches both years: written beside the readers' filter without brackets, its OR would let every
    row of one year through."""
    found = source.search(QUESTION, len(ROWS), readers=BOB)
    assert {c.doc_id for c in found} == READABLE_TO_BOB
    assert not {row for _, rows in calls for row in rows} & set(HR)


def _assert_unrestricted_as_before(plain, restricted) -> None:
    """A source without `readers_field` ignores readers (it names none), and one with it, asked for everything,
    answers as it did."""
    before = [(c.doc_id, round(c.native_score, 5)) for c in plain.search(QUESTION, 5)]
    assert [(c.doc_id, round(c.native_score, 5)) for c in plain.search(QUESTION, 5, readers=BOB)] == before
    assert [(c.doc_id, round(c.native_score, 5)) for c in restricted.search(QUESTION, 5)] == before


# --- LanceDB ------------------------------------------------------------------------------------------------------

def _lance(tmp_path, vectors):
    lancedb = pytest.importorskip("lancedb")
    import pyarrow as pa
    from lancedb.index import FTS

    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("year", pa.int64()),
                        ("readers", pa.list_(pa.string())), ("vector", pa.list_(pa.float32(), len(vectors[0])))])
    table = lancedb.connect(str(tmp_path / "lance")).create_table(
        "notes", [{"id": i, "text": t, "year": YEAR[i], "readers": r, "vector": v}
                  for (i, t, r), v in zip(ROWS, vectors)], schema=schema)
    table.create_index("text", config=FTS())
    return str(tmp_path / "lance")


def test_lancedb_filters_readers_in_its_sql_before_the_nearest_are_taken(tmp_path, vectors, monkeypatch):
    from gradfuse.sources.engines import open_engine
    from gradfuse.sources.lance_table import LanceSettings

    uri = _lance(tmp_path, vectors)
    for mode in ("dense", "bm25", "hybrid"):
        source = open_engine("store", LanceSettings(uri=uri, table="notes", readers_field="readers"), 10.0, mode)
        calls = []
        real_search = source._table.search

        def search(*args, **kwargs):  # the query LanceDB builds: its rows, as LanceDB itself returns them
            builder = real_search(*args, **kwargs)
            real_rows = builder.to_list

            def to_list():
                rows = real_rows()
                calls.append(({"where": builder._where}, [row["id"] for row in rows]))
                return rows

            builder.to_list = to_list
            return builder

        monkeypatch.setattr(source._table, "search", search)
        _assert_pushed_down(source, calls)
        calls.clear()
        both_years = open_engine("store", LanceSettings(uri=uri, table="notes", readers_field="readers",
                                                        filter="year = 2023 OR year = 2024"), 10.0, mode)
        monkeypatch.setattr(both_years._table, "search", search)
        _assert_static_filter_kept(both_years, calls)
        assert both_years._filter(BOB) == ("(year = 2023 OR year = 2024) AND (`readers` IS NULL OR "
                                           "array_length(`readers`) = 0 OR array_has_any(`readers`, ['bob', 'eng']))")
    plain = open_engine("store", LanceSettings(uri=uri, table="notes"), 10.0, "dense")
    _assert_unrestricted_as_before(plain, open_engine(
        "store", LanceSettings(uri=uri, table="notes", readers_field="readers"), 10.0, "dense"))
    count, texts = open_engine("store", LanceSettings(uri=uri, table="notes", readers_field="readers"), 10.0,
                               "dense").sample_texts(100)
    assert count == len(texts) == len(ROWS)  # summaries describe the whole table


def test_lancedb_refuses_a_readers_field_that_is_no_list_of_text(tmp_path, vectors):
    from gradfuse.sources.base import SourceError
    from gradfuse.sources.engines import open_engine
    from gradfuse.sources.lance_table import LanceSettings

    uri = _lance(tmp_path, vectors)
    with pytest.raises(SourceError, match="no column 'owners' .readers_field"):
        open_engine("store", LanceSettings(uri=uri, table="notes", readers_field="owners"), 10.0, "dense")
    with pytest.raises(SourceError, match="'text' .readers_field. is string: it must be a list of text"):
        open_engine("store", LanceSettings(uri=uri, table="notes", readers_field="text"), 10.0, "dense")


# --- Qdrant (local folder mode) -----------------------------------------------------------------------------------

def test_qdrant_filters_readers_in_its_own_filter(tmp_path, vectors, monkeypatch):
    pytest.importorskip("qdrant_client")
    from qdrant_client import QdrantClient, models

    from gradfuse.sources.engines import open_engine
    from gradfuse.sources.qdrant_collection import QdrantSettings

    client = QdrantClient(path=str(tmp_path / "qdrant"))
    client.create_collection("notes", vectors_config=models.VectorParams(size=len(vectors[0]),
                                                                         distance=models.Distance.COSINE))
    client.upsert("notes", [models.PointStruct(id=n, vector=v, payload={"name": i, "text": t, "year": YEAR[i],
                                                                        **({} if r is None else {"readers": r})})
                            for n, ((i, t, r), v) in enumerate(zip(ROWS, vectors))])  # None: no key at all
    client.close()  # the embedded mode: one client at a time
    fields = dict(uri=str(tmp_path / "qdrant"), collection="notes", id_field="name")
    source = open_engine("store", QdrantSettings(**fields, readers_field="readers"), 10.0, "dense")
    ids = lambda found: [point.payload["name"] for point in found.points]  # noqa: E731
    calls = _watch(monkeypatch, source._client, "query_points", ids)
    _assert_pushed_down(source, calls)
    source.search(QUESTION, 5, readers=BOB)
    sent = calls[0][0]["query_filter"]
    assert sent.should and sent.must is None  # no static filter: the readers' alone

    calls.clear()
    both_years = {"should": [{"key": "year", "match": {"value": 2023}}, {"key": "year", "match": {"value": 2024}}]}
    _assert_static_filter_kept(open_engine("store", QdrantSettings(**fields, readers_field="readers",
                                                                   filter=both_years), 10.0, "dense"), calls)
    static, readable = calls[0][0]["query_filter"].must  # both must hold
    assert len(static.should) == 2 and isinstance(readable.should[0], models.IsEmptyCondition)
    _assert_unrestricted_as_before(open_engine("store", QdrantSettings(**fields), 10.0, "dense"),
                                   open_engine("store", QdrantSettings(**fields, readers_field="readers"), 10.0,
                                               "dense"))
    assert source.sample_texts(100)[0] == len(ROWS)  # summaries describe the whole collection


def test_qdrant_refuses_a_readers_field_no_point_holds_and_reads_a_nested_one(tmp_path, vectors):
    pytest.importorskip("qdrant_client")
    from qdrant_client import QdrantClient, models

    from gradfuse.sources.base import SourceError
    from gradfuse.sources.engines import open_engine
    from gradfuse.sources.qdrant_collection import QdrantSettings

    client = QdrantClient(path=str(tmp_path / "qdrant"))
    client.create_collection("notes", vectors_config=models.VectorParams(size=len(vectors[0]),
                                                                         distance=models.Distance.COSINE))
    client.upsert("notes", [models.PointStruct(id=n, vector=v, payload={"name": i, "text": t,
                                                                        **({} if r is None else {"acl": {"who": r}})})
                            for n, ((i, t, r), v) in enumerate(zip(ROWS, vectors))])
    client.close()
    fields = dict(uri=str(tmp_path / "qdrant"), collection="notes", id_field="name")
    for misspelt in ("readers", "acl.whom"):  # every point would be open to every reader: refused at open
        with pytest.raises(SourceError, match=f"no point holds readers_field '{misspelt}'"):
            open_engine("store", QdrantSettings(**fields, readers_field=misspelt), 10.0, "dense")
    source = open_engine("store", QdrantSettings(**fields, readers_field="acl.who"), 10.0, "dense")
    found = source.search(QUESTION, 6, readers=BOB)  # Qdrant's nested key filters; the second check reads it too
    assert {c.doc_id for c in found} == READABLE_TO_BOB
    assert {c.doc_id: c.readers for c in found}["eng1"] == ("eng", "ops")
    assert not any(may_read(c.readers, NOBODY) for c in source.search(QUESTION, 6) if c.doc_id in HR)


# --- Milvus Lite --------------------------------------------------------------------------------------------------

def _milvus(tmp_path, vectors) -> str:
    pymilvus = pytest.importorskip("pymilvus")
    from pymilvus import DataType

    path = str(tmp_path / "milvus.db")
    client = pymilvus.MilvusClient(path)
    schema = client.create_schema(auto_id=False, enable_dynamic_field=True)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=len(vectors[0]))
    schema.add_field("text", DataType.VARCHAR, max_length=512)
    schema.add_field("year", DataType.INT64)
    schema.add_field("readers", DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=16, max_length=128,
                     nullable=True)
    index = client.prepare_index_params()
    index.add_index("vector", metric_type="COSINE", index_type="FLAT")
    client.create_collection("notes", schema=schema, index_params=index)
    client.insert("notes", [{"id": i, "text": t, "year": YEAR[i], "vector": v, "readers": r, "owners": r or []}
                            for (i, t, r), v in zip(ROWS, vectors)])  # owners: the same, in the dynamic field
    client.close()
    return path


def test_milvus_filters_readers_in_its_boolean_expression(tmp_path, vectors, monkeypatch):
    from gradfuse.sources.engines import open_engine
    from gradfuse.sources.milvus_collection import MilvusSettings

    fields = dict(uri=_milvus(tmp_path, vectors), collection="notes")
    source = open_engine("store", MilvusSettings(**fields, readers_field="readers"), 10.0, "dense")
    ids = lambda found: [hit["id"] for hits in found for hit in hits]  # noqa: E731
    calls = _watch(monkeypatch, source._client, "search", ids)
    _assert_pushed_down(source, calls)
    source.search(QUESTION, 5, readers=BOB)
    assert calls[0][0]["filter"] == ('readers is null or array_length(readers) == 0 or '
                                     'array_contains_any(readers, ["bob", "eng"])')
    assert "readers" in calls[0][0]["output_fields"]

    calls.clear()
    both_years = open_engine("store", MilvusSettings(**fields, readers_field="readers",
                                                     filter="year == 2023 or year == 2024"), 10.0, "dense")
    calls = _watch(monkeypatch, both_years._client, "search", ids)
    _assert_static_filter_kept(both_years, calls)
    assert calls[0][0]["filter"].startswith("(year == 2023 or year == 2024) and (readers is null or ")
    _assert_unrestricted_as_before(open_engine("store", MilvusSettings(**fields), 10.0, "dense"),
                                   open_engine("store", MilvusSettings(**fields, readers_field="readers"), 10.0,
                                               "dense"))
    assert source.sample_texts(100)[0] == len(ROWS)  # summaries describe the whole collection


def test_milvus_refuses_readers_in_its_dynamic_field(tmp_path, vectors):
    from gradfuse.sources.base import SourceError
    from gradfuse.sources.engines import open_engine
    from gradfuse.sources.milvus_collection import MilvusSettings

    fields = dict(uri=_milvus(tmp_path, vectors), collection="notes")
    with pytest.raises(SourceError, match="declares no field 'owners' .readers_field.*ARRAY of VARCHAR"):
        open_engine("store", MilvusSettings(**fields, readers_field="owners"), 10.0, "dense")
    with pytest.raises(SourceError, match="'text' .readers_field. is VARCHAR: it must be an ARRAY of VARCHAR"):
        open_engine("store", MilvusSettings(**fields, readers_field="text"), 10.0, "dense")


# --- Chroma (its real server) -------------------------------------------------------------------------------------

def test_chroma_filters_readers_in_its_where_on_its_server(chroma_server, vectors, monkeypatch):
    import chromadb

    from gradfuse.sources.base import SourceError
    from gradfuse.sources.chroma_collection import ChromaSettings
    from gradfuse.sources.engines import open_engine

    url, _, port = chroma_server
    client = chromadb.HttpClient(host="127.0.0.1", port=port)

    def readers_of(row_id, readers):  # Chroma keeps no empty list and cannot ask for a missing key: ["*"]
        if row_id == "open0":
            return {}  # no key: read only by callers who read every document
        return {"readers": readers or ["*"]} if row_id != "open1" else {"readers": "*"}

    client.create_collection("access", metadata={"hnsw:space": "cosine"}, embedding_function=None).add(
        ids=[i for i, _, _ in ROWS], documents=[t for _, t, _ in ROWS], embeddings=vectors,
        metadatas=[{"year": YEAR[i], **readers_of(i, r)} for i, _, r in ROWS])
    fields = dict(uri=url, collection="access")
    source = open_engine("store", ChromaSettings(**fields, readers_field="readers"), 10.0, "dense")
    calls = _watch(monkeypatch, source._collection, "query", lambda found: found["ids"][0])
    # the one difference: a passage without the key (open0) is for callers who read every document only
    _assert_pushed_down(source, calls, everyone={"open1", "open2"})
    source.search(QUESTION, 5, readers=BOB)
    assert "open0" in {c.doc_id for c in source.search(QUESTION, len(ROWS))}
    assert calls[0][0]["where"] == {"$or": [{"readers": {"$in": ["*", "bob", "eng"]}},
                                            {"readers": {"$contains": "*"}}, {"readers": {"$contains": "bob"}},
                                            {"readers": {"$contains": "eng"}}]}
    open2 = next(c for c in source.search(QUESTION, len(ROWS), readers=NOBODY) if c.doc_id == "open2")
    assert open2.readers == ()  # ["*"]: no reader named, every reader may read it

    calls.clear()
    both_years = {"$or": [{"year": 2023}, {"year": 2024}]}
    restricted = open_engine("store", ChromaSettings(**fields, readers_field="readers", filter=both_years), 10.0,
                             "dense")
    calls = _watch(monkeypatch, restricted._collection, "query", lambda found: found["ids"][0])
    found = restricted.search(QUESTION, len(ROWS), readers=BOB)
    assert {c.doc_id for c in found} == READABLE_TO_BOB - {"open0"}
    assert calls[0][0]["where"]["$and"][0] == both_years
    _assert_unrestricted_as_before(open_engine("store", ChromaSettings(**fields), 10.0, "dense"),
                                   open_engine("store", ChromaSettings(**fields, readers_field="readers"), 10.0,
                                               "dense"))
    assert source.sample_texts(100)[0] == len(ROWS)  # summaries describe the whole collection

    client.get_collection("access").update(ids=["eng0"], metadatas=[{"year": 2023, "readers": 7}])
    with pytest.raises(SourceError, match="'readers' .readers_field. of a record holds a number: it must be a list of"):
        source.search(QUESTION, len(ROWS))  # read by a caller who reads everything: found malformed, not guessed


def test_lancedb_answers_a_limited_key_by_vectors_since_its_full_text_scores_count_every_row(tmp_path, vectors):
    """LanceDB's BM25 weighs a word by the whole table: a key limited by readers_field would read in its scores how
    many rows it may not read hold a word (issue 69)."""
    from gradfuse.sources.engines import open_engine
    from gradfuse.sources.lance_table import LanceSettings

    uri = _lance(tmp_path, vectors)
    for mode in ("bm25", "hybrid"):
        source = open_engine("store", LanceSettings(uri=uri, table="notes", readers_field="readers"), 10.0, mode)
        limited = source.search(QUESTION, 5, readers=BOB)
        assert limited and all(c.score_kind.endswith("distance") for c in limited)
        assert not any(getattr(c, "retrieval_ranks", None) and "bm25" in c.retrieval_ranks for c in limited)
    owner = open_engine("store", LanceSettings(uri=uri, table="notes", readers_field="readers"), 10.0, "bm25")
    assert {c.score_kind for c in owner.search(QUESTION, 5)} == {"bm25"}
