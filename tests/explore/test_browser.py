"""The explorer in a real browser: Debian's headless chromium driven by selenium through chromium-driver
(paths given, nothing downloaded). The server is the real ``corpus-io explore`` command on 127.0.0.1 with a
port from the OS; one browser session for the module.

Set ``CORPUS_IO_EXPLORE_SCREENSHOTS=DIR`` to keep the screenshots (docs/explore.png is made this way)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, hang_limit
from tests.explore.conftest import HYP_EDITS, fixture_texts

pytestmark = pytest.mark.network
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
IDLE = "document.body.dataset.busy==='0'"  # the table shows the answer to the last sort/filter


@pytest.fixture(scope="module")
def browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail("chromium and chromium-driver are not installed: run recipes/tools/install_system_packages.sh")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--mute-audio",
                "--autoplay-policy=no-user-gesture-required", "--window-size=1400,900", "--no-first-run",
                "--disable-extensions", "--disable-background-networking"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_script_timeout(hang_limit(30))
    yield driver
    driver.quit()


class Explore:
    """``corpus-io explore ... ++port=0`` in its own process group; ``url`` is what it printed."""

    def __init__(self, *args: str, env: dict | None = None):
        cmd = [str(BIN / "corpus-io"), "explore", *args, "++port=0"]
        full_env = dict(os.environ, CORPUS_IO_NO_PROGRESS="1", PYTHONPATH=str(REPO), **(env or {}))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                     env=full_env, start_new_session=True)
        deadline = time.time() + hang_limit(120)
        self.url = None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if "open http://" in line:
                self.url = line.split("open ", 1)[1].split()[0]
                break
        if self.url is None:
            self.close()
            pytest.fail(f"corpus-io explore did not print its URL: {self.proc.stderr.read()[-3000:]}")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


def wait_for(driver, script: str, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, hang_limit(timeout), poll_frequency=0.1).until(lambda d: d.execute_script(script))


def screenshot(driver, path: Path) -> None:
    """Save a screenshot and check it is a picture, not a blank page: many colours, dark text on light."""
    from PIL import Image

    png = driver.get_screenshot_as_png()
    path.write_bytes(png)
    img = Image.open(io.BytesIO(png)).convert("RGB")
    colors = img.getcolors(maxcolors=1 << 20) or []
    assert len(colors) > 50, f"{path} looks blank ({len(colors)} colours)"
    lo, hi = img.convert("L").getextrema()
    assert hi - lo > 150, f"{path} has no contrast"
    keep = os.environ.get("CORPUS_IO_EXPLORE_SCREENSHOTS")
    if keep:
        shutil.copy(path, Path(keep) / path.name)


def member(shards: Path, key: str) -> tuple[bytes, str]:
    """The audio bytes and transcript of ``key`` read from the packed tars themselves."""
    for tar_path in sorted(shards.glob("shard-*.tar")):
        with tarfile.open(tar_path) as tar:
            names = tar.getnames()
            audio = [n for n in names if n.startswith(key + ".") and not n.endswith((".txt", ".json"))]
            if audio:
                return tar.extractfile(audio[0]).read(), tar.extractfile(key + ".txt").read().decode()
    raise AssertionError(f"{key} is in no shard")


def rows_text(driver, column: str) -> list[str]:
    return driver.execute_script(
        "const i=[...document.querySelectorAll('#head th')].findIndex(t=>t.dataset.col===arguments[0]);"
        "return [...document.querySelectorAll('#body tr')].map(r=>r.children[i].textContent);", column)


def play_and_check(driver, row_key: str, want_bytes: bytes, want_text: str, shots: Path, name: str) -> None:
    """Filter to ``row_key``, open it, play it; the element's duration, bytes and text match the member's."""
    driver.execute_script("document.getElementById('clear').click()")
    box = driver.find_element("id", "f-key")
    box.clear()
    box.send_keys(row_key)
    driver.find_element("id", "apply").click()
    wait_for(driver, f"return {IDLE} && document.querySelectorAll('#body tr').length===1 && "
                     f"document.querySelector('#body tr').textContent.includes('{row_key}')")
    driver.find_element("css selector", "#body tr").click()
    wait_for(driver, f"return document.getElementById('row-key').textContent==='{row_key}'")
    assert driver.find_element("id", "row-text").text == want_text
    assert driver.execute_script("return document.getElementById('row-error').hidden")
    duration = driver.execute_async_script(
        "const done=arguments[arguments.length-1], p=document.getElementById('player');"
        "const go=()=>p.play().then(()=>done(p.duration)).catch(e=>done('play failed: '+e));"
        "if (p.readyState>=1) go(); else p.addEventListener('loadedmetadata', go, {once:true});")
    import soundfile as sf

    info = sf.info(io.BytesIO(want_bytes))
    assert duration == pytest.approx(info.duration, abs=0.03), duration
    digest = driver.execute_async_script(
        "const done=arguments[arguments.length-1], p=document.getElementById('player');"
        "fetch(p.currentSrc).then(r=>r.arrayBuffer()).then(b=>crypto.subtle.digest('SHA-256', b))"
        ".then(h=>done([...new Uint8Array(h)].map(x=>x.toString(16).padStart(2,'0')).join('')))"
        ".catch(e=>done('fetch failed: '+e));")
    assert digest == hashlib.sha256(want_bytes).hexdigest()
    wait_for(driver, "return document.getElementById('wave').dataset.drawn==='1' && "
                     "document.getElementById('spec').complete && document.getElementById('spec').naturalWidth>0")
    wait_for(driver, "const p=document.getElementById('player'); return p.currentTime>0 || p.ended")
    screenshot(driver, shots / name)


def test_page_sorts_filters_opens_a_row_plays_it_and_marks_decode_errors(browser, packed, decode_dirs, tmp_path):
    run1, run2 = decode_dirs
    server = Explore(f"++input={packed}/data.list", f"++decode_dir={run1}", f"++compare_dir={run2}",
                     f"++cache_dir={tmp_path / 'cache'}")
    try:
        browser.get(server.url)
        wait_for(browser, "return document.body.dataset.ready==='1'")
        assert len(browser.find_elements("css selector", "#body tr")) == 24
        browser.find_element("css selector", "th[data-col=duration]").click()
        wait_for(browser, "return document.querySelector('th.sorted')?.dataset.col==='duration' && " + IDLE)
        durs = [float(x) for x in rows_text(browser, "duration")]
        assert durs == sorted(durs) and len(durs) == 24
        browser.find_element("css selector", "th[data-col=duration]").click()
        wait_for(browser, "return document.querySelector('th.sorted.desc')?.dataset.col==='duration' && " + IDLE)
        durs = [float(x) for x in rows_text(browser, "duration")]
        assert durs == sorted(durs, reverse=True)
        browser.find_element("id", "f-text").send_keys("^[a-z ]+$")  # English-only transcripts
        browser.find_element("id", "f-dur-min").send_keys("1.5")
        browser.find_element("id", "apply").click()
        texts = fixture_texts()
        want = {k for k, t in texts.items() if t.replace(" ", "").isascii()}
        wait_for(browser, "return " + IDLE)
        keys = set(rows_text(browser, "key"))
        assert keys and keys <= want
        # one wav and one flac utterance, their audio straight from the tar member
        for key in ("spk0-utt008", "spk1-utt009"):
            data, text = member(packed, key)
            assert text == texts[key]
            play_and_check(browser, key, data, text, tmp_path, f"explore-row-{key}.png")
        marks = browser.execute_script("return [...document.querySelectorAll('#row-diff .diff[data-run=\"1\"] "
                                       "span')].map(s=>s.className)")
        assert len(marks) == 4 and set(marks) == {""}  # spk1-utt009 was decoded exactly: 4 words, no mark
        play_and_check(browser, "spk0-utt008", *member(packed, "spk0-utt008"), tmp_path, "explore-row.png")
        marks = browser.execute_script("return [...document.querySelectorAll('#row-diff .diff[data-run=\"1\"] "
                                       "span.S')].map(s=>s.textContent)")
        assert marks == [HYP_EDITS["spk0-utt008"].split()[3]]  # "box" for "fox"
        browser.find_element("id", "clear").click()  # the whole table beside the open row, worst CER first
        browser.find_element("css selector", "th[data-col=cer]").click()
        browser.find_element("css selector", "th[data-col=cer]").click()
        wait_for(browser, "return document.querySelector('th.sorted.desc')?.dataset.col==='cer' && " + IDLE)
        assert rows_text(browser, "key")[:3] == ["spk2-utt010", "spk0-utt012", "spk0-utt008"]  # CER 5/10, 3/22, 1/35
        browser.execute_script("document.querySelector('.tablewrap').scrollLeft=0; window.scrollTo(0, 0)")
        screenshot(browser, tmp_path / "explore.png")
        browser.find_element("id", "tab-dataset").click()
        wait_for(browser, "return document.body.dataset.dataset==='1' && "
                          "document.querySelectorAll('#alphabet span').length>20")
        cards = browser.find_element("id", "totals").text
        assert "24\nutterances" in cards and "4\nspeakers" in cards
        screenshot(browser, tmp_path / "explore-dataset.png")
    finally:
        server.close()


def test_s3_shards_play_in_the_browser_bytes_and_text_equal_to_the_member(browser, packed, seaweed,  # noqa: F811
                                                                          tmp_path):
    endpoint, fs = seaweed
    for p in sorted(packed.glob("shard-*.tar")):
        fs.put(str(p), f"corpus/explore/{p.name}")
    data_list = tmp_path / "s3.list"
    data_list.write_text("".join(f"s3://corpus/explore/{p.name}\n" for p in sorted(packed.glob("shard-*.tar"))))
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "corpusio", "AWS_SECRET_ACCESS_KEY": "corpusio-secret"}
    server = Explore(f"++input={data_list}", f"++cache_dir={tmp_path / 'cache'}", env=env)
    try:
        browser.get(server.url)
        wait_for(browser, "return document.body.dataset.ready==='1'")
        assert browser.find_element("id", "summary").text.count("24 utterances") == 1
        key = "spk3-utt015"  # a mixed zh/en transcript
        play_and_check(browser, key, *member(packed, key), tmp_path, "explore-s3.png")
        assert "s3://corpus/explore/shard-" in browser.find_element("id", "row-where").text
    finally:
        server.close()


def test_a_raw_list_shows_each_audio_file_instead_of_a_shard_and_no_speaker_count(browser, tmp_path):
    """A raw list is one pseudo-shard: the table names each row's file, the shard filter is hidden, an
    unknown speaker count is "-", and a row plays its source file's own bytes."""
    import json

    from tests.conftest import FIXTURE

    texts = fixture_texts()
    wavs = dict(line.split(" ", 1) for line in (FIXTURE / "wav.scp").read_text().splitlines() if line)
    raw = tmp_path / "train.jsonl"
    raw.write_text("".join(json.dumps({"key": k, "source": str(REPO / wavs[k]), "target": texts[k]}) + "\n"
                           for k in sorted(wavs)), encoding="utf-8")
    server = Explore(f"++input={raw}", f"++cache_dir={tmp_path / 'cache'}")
    try:
        browser.get(server.url)
        wait_for(browser, "return document.body.dataset.ready==='1'")
        heads = browser.execute_script("return [...document.querySelectorAll('#head th')].map(t=>t.dataset.col)")
        assert "source" in heads and "shard" not in heads, heads
        assert rows_text(browser, "source") == [os.path.basename(wavs[k]) for k in sorted(wavs)]
        assert not browser.find_element("id", "f-shard").is_displayed()
        key = sorted(wavs)[3]
        play_and_check(browser, key, (REPO / wavs[key]).read_bytes(), texts[key], tmp_path, "explore-raw.png")
        browser.find_element("id", "tab-dataset").click()
        wait_for(browser, "return document.body.dataset.dataset==='1'")
        cards = browser.find_element("id", "totals").text
        assert f"{len(wavs)}\nutterances" in cards and "-\nspeakers" in cards, cards
        assert "speakers" not in browser.find_element("id", "summary").text
    finally:
        server.close()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_score_figures_sort_by_their_headers_filter_to_the_flagged_and_play_a_flagged_row(browser, packed,
                                                                                         tmp_path):
    """++scores (corpus-io score's scores.jsonl): its columns sort by a click, show: flagged keeps the flagged,
    the figure filter bounds one figure, and a flagged row opens with its reasons and plays its audio."""
    import json

    keys = sorted(fixture_texts())
    rows = [{"key": k, "flagged": i in (3, 17), "reasons": ["loss_per_token 9 > 1"] if i in (3, 17) else [],
             "cer": 0.0, "wer": 0.0, "loss_per_frame": 0.01, "loss_per_token": 9.0 if i in (3, 17) else 0.1 + i / 100,
             "chars_per_second": 10.0, "tokens_per_second": 2.0, "alignable": True, "hyp": "x"}
            for i, k in enumerate(keys)]
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    server = Explore(f"++input={packed}/data.list", f"++scores={scores}", f"++cache_dir={tmp_path / 'cache'}")
    try:
        browser.get(server.url)
        wait_for(browser, "return document.body.dataset.ready==='1'")
        head = browser.find_element("css selector", "th[data-col=score_loss_per_token]")
        head.click()
        head = browser.find_element("css selector", "th[data-col=score_loss_per_token]")
        head.click()
        wait_for(browser, "return document.querySelector('th.sorted.desc')?.dataset.col==='score_loss_per_token' && "
                 + IDLE)
        assert sorted(rows_text(browser, "key")[:2]) == [keys[3], keys[17]]
        assert rows_text(browser, "score_flagged")[:3] == ["yes", "yes", "no"]
        browser.execute_script("document.getElementById('f-flag').value='flagged'")
        browser.find_element("id", "apply").click()
        wait_for(browser, "return " + IDLE + " && document.querySelectorAll('#body tr').length===2")
        browser.execute_script("const f=document.getElementById('f-flag'); f.value='';"
                               "document.getElementById('f-score-fig').value='score_loss_per_token';"
                               "document.getElementById('f-score-max').value='0.2'")
        browser.find_element("id", "apply").click()
        want = sum(1 for i in range(len(keys)) if i not in (3, 17) and 0.1 + i / 100 <= 0.2)
        wait_for(browser, "return " + IDLE + f" && document.querySelectorAll('#body tr').length==={want}")
        play_and_check(browser, keys[3], *member(packed, keys[3]), tmp_path, "explore-score-row.png")
        meta = browser.find_element("id", "row-meta").text
        assert "loss_per_token 9 > 1" in meta and "score: flagged yes" in meta
    finally:
        server.close()
