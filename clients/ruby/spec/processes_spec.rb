# frozen_string_literal: true

require "spec_helper"

RSpec.shared_examples "a cell of many processes" do |adapter|
  let(:cell) { SpecSupport.cell(adapter, "a") }
  let(:other) { SpecSupport.cell(adapter, "b") }

  it "lets workers forked from a parent that loaded the models (and made no call) save" do
    name = unique("forked")
    output, status = worker(cell, "fork", { "TC_USERNAME" => name, "TC_WORKERS" => "2" })
    expect(status).to be_success, output
    expect(output.lines.map(&:strip).sort).to eq(["worker 0: ok", "worker 1: ok"])
    expect(lookup(cell, :username, "#{name}-0")).to eq([cell.cell_id, "active"])
    expect(lookup(cell, :username, "#{name}-1")).to eq([cell.cell_id, "active"])
  end

  it "lets exactly one of two processes racing for one username succeed" do
    name = unique("raced")
    start = File.join(SpecSupport::TMP, "start-#{name}")
    racers = [cell, other].map { |c| worker(c, "race", { "TC_USERNAME" => name, "TC_START" => start }, wait: false) }
    sleep 1.5 # both processes boot (loading ActiveRecord and grpc) and wait for the start file
    File.write(start, "")
    outputs = racers.map { |pid, reader| finish(pid, reader).first.strip }
    expect(outputs.count("ok")).to eq(1), outputs.inspect
    loser = outputs.find { |o| o != "ok" }
    expect(loser).to match(/Username (has already been taken|is being changed, try again)/)
    winner = [cell, other][outputs.index("ok")]
    expect(lookup(cell, :username, name)).to eq([winner.cell_id, "active"])
    expect([cell, other].sum { |c| c.user.where(username: name).count }).to eq(1)
  end

  it "has the claims of a process killed before its COMMIT freed by reconcile --once" do
    name = unique("killed-before")
    _output, status = worker(cell, "kill_before_commit", { "TC_USERNAME" => name })
    expect(status.termsig).to eq(Signal.list["KILL"])
    expect(lookup(cell, :username, name)).to eq([cell.cell_id, "creating"])
    expect(cell.user.where(username: name)).to be_empty

    args = adapter == :sqlite ? ["--staleness", "1s"] : [] # SQLite names no transaction: staleness
    sleep 1.1 if adapter == :sqlite
    stdout, stderr, result = nil
    # PostgreSQL reports the killed backend's transaction aborted once it has noticed the exit.
    5.times do
      stdout, stderr, result = sidecar(cell, "reconcile", "--once", *args)
      break if lookup(cell, :username, name).nil?

      sleep 0.2
    end
    expect(result).to be_success, stderr
    expect(lookup(cell, :username, name)).to be_nil
    expect(cell.client.outstanding_leases).to be_empty
    expect(stdout + stderr).not_to be_empty
  end

  it "has the lease of a process killed after its COMMIT committed by reconcile --once" do
    name = unique("killed-after")
    _output, status = worker(cell, "kill_after_commit", { "TC_USERNAME" => name })
    expect(status.termsig).to eq(Signal.list["KILL"])
    expect(cell.user.where(username: name).count).to eq(1)
    expect(cell.leases_outstanding).to eq(1)
    expect(lookup(cell, :username, name)).to eq([cell.cell_id, "creating"])

    _stdout, stderr, result = sidecar(cell, "reconcile", "--once")
    expect(result).to be_success, stderr
    expect(lookup(cell, :username, name)).to eq([cell.cell_id, "active"])
    expect(cell.leases_outstanding).to eq(0)
  end
end

RSpec.describe "processes of one cell" do
  context "on SQLite" do
    it_behaves_like "a cell of many processes", :sqlite
  end

  context "on PostgreSQL" do
    it_behaves_like "a cell of many processes", :postgresql
  end

  it "fails at once with ForkedAfterCall in a child of a process that made a call, never hangs" do
    cell = SpecSupport.cell(:sqlite, "a")
    cell.client.outstanding_leases # this process has made a call
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      begin
        cell.client.lookup_claim(:username, "anyone")
        writer.puts "no error"
      rescue TopologyClaims::ForkedAfterCall => e
        writer.puts e.message
      end
      exit!(0)
    end
    writer.close
    message, = finish(pid, reader, patience: 20)
    expect(message).to match(/forked from pid #{Process.pid}.*no fork support/)
  end
end
