"""The endpoint's end of the link to its training process: no answer, however it comes, holds a render past its
deadline or blocks the training process."""

from __future__ import annotations

import json
import socket
import threading

from neuron_exporter.node.job_link import HEADER, METRICS, REQUEST, Asker, send_answer
from tests.support.processes import wait_until


def ask_in_thread(asker: Asker, timeout: float) -> tuple[threading.Thread, list]:
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(asker.ask(METRICS, timeout)), daemon=True)
    thread.start()
    return thread, answers


def question(training_end: socket.socket) -> int:
    kind, sequence = REQUEST.unpack(training_end.recv(REQUEST.size))
    assert kind == METRICS
    return sequence


def test_an_answer_that_stalls_half_way_holds_no_question_past_its_deadline():
    endpoint_end, training_end = socket.socketpair()
    asker = Asker(endpoint_end)
    thread, answers = ask_in_thread(asker, timeout=0.2)
    first = question(training_end)
    document = json.dumps({"sequence": first}).encode()
    body = b"x" * 100_000
    # The training process stops (SIGSTOP, a swapped-out page) after half of its answer.
    training_end.sendall(HEADER.pack(len(document), len(body)) + document + body[:50_000])
    thread.join(30)
    assert not thread.is_alive() and answers == [None]
    # It resumes: the rest of the stale answer, then the answer to the next question, which is served.
    thread, answers = ask_in_thread(asker, timeout=30)
    second = question(training_end)
    training_end.sendall(body[50_000:])
    send_answer(training_end, {"sequence": second, "meta": {}}, b"fresh")
    thread.join(30)
    assert answers == [({"sequence": second, "meta": {}}, b"fresh")]
    assert not asker.closed


def test_answers_that_come_after_their_question_gave_up_never_fill_the_link():
    endpoint_end, training_end = socket.socketpair()
    asker = Asker(endpoint_end)
    assert asker.ask(METRICS, 0.0) is None
    sequence = question(training_end)
    # The training process's spool thread answers late, many times over (far more than the link's buffers hold);
    # with nobody reading, its send would time out and it would take its endpoint for gone.
    training_end.settimeout(10)
    for _ in range(64):
        send_answer(training_end, {"sequence": sequence}, b"x" * (1 << 20))
    thread, answers = ask_in_thread(asker, timeout=30)
    send_answer(training_end, {"sequence": question(training_end), "meta": {}}, b"now")
    thread.join(30)
    assert answers[0][1] == b"now"


def test_questions_to_a_training_process_that_reads_none_never_block():
    endpoint_end, training_end = socket.socketpair()
    endpoint_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1024)
    asker = Asker(endpoint_end)
    thread = threading.Thread(target=lambda: [asker.ask(METRICS, 0.0) for _ in range(20_000)], daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()  # the questions it could not send were answered None, not waited on
    assert not asker.closed
    training_end.close()


def test_a_closed_link_is_seen_without_a_question():
    endpoint_end, training_end = socket.socketpair()
    asker = Asker(endpoint_end)
    training_end.close()
    wait_until(lambda: asker.closed, timeout=30, what="the asker to see the link closed")
    assert asker.ask(METRICS, 30) is None
