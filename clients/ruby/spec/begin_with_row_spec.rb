# frozen_string_literal: true

require "spec_helper"

# On PostgreSQL the leases_outstanding row of a claimed save travels with its BEGIN
# (TopologyClaims::BeginWithRow, decision 125): the same local round trips as a plain save.
RSpec.describe "TopologyClaims::BeginWithRow (the row at BEGIN, PostgreSQL)" do
  let(:cell) { SpecSupport.cell(:postgresql, "a") }
  let(:rows) { -> { cell.connection.select_value("SELECT count(*) FROM leases_outstanding").to_i } }

  # The SQL the block sends, and the local_transaction of every lease it begins.
  def traced
    statements = []
    sent = []
    subscribers = [
      ActiveSupport::Notifications.subscribe("sql.active_record") { |*, p| statements << p[:sql] },
      ActiveSupport::Notifications.subscribe("lease_begun.topology_claims") { |*, p| sent << p[:local_transaction] }
    ]
    begin
      yield
    ensure
      subscribers.each { |s| ActiveSupport::Notifications.unsubscribe(s) }
    end
    TopologyClaims::Committer.instance.drain
    [statements, sent]
  end

  # A model of the users table whose claim's condition is false: it asks for the row, then has
  # nothing to lease.
  def unclaimed_model
    SpecSupport.instance_eval do
      @unclaimed ||= begin
        config = SpecSupport.cell(:postgresql, "a").config
        model = Class.new(SpecSupport.cell(:postgresql, "a").base) do
          self.table_name = "users"
          include TopologyClaims::Claimable
          claims_owner :user
          claims_table :users
          claim :username, namespace: "usernames", if: -> { false }
          claims_configuration config
        end
        SpecSupport.const_set(:UnclaimedUser, model)
      end
    end
  end

  before do
    TopologyClaims::Committer.instance.drain
    TopologyClaims.clean_up!(cell.connection)
  end

  it "sends a claimed create in a plain create's three statements, naming the transaction that wrote the row" do
    cell.user.create!(username: unique("warm")) # the model's schema and the cluster's id, read once
    name = unique("begin-row")
    statements, sent = traced { cell.user.create!(username: name, email: "#{name}@example.com") }

    expect(statements.size).to eq(3), statements.join("\n")
    expect(statements[0]).to start_with("BEGIN; INSERT INTO leases_outstanding")
    expect(statements[1]).to start_with('INSERT INTO "users"')
    expect(statements[2]).to eq("COMMIT")
    expect(sent.size).to eq(1)
    system, xid = sent.first.match(/\Apg:(\d+):(\d+)\z/)&.captures
    expect(xid).not_to be_nil, sent.inspect
    expect(system).to eq(cell.connection.select_value("SELECT system_identifier::text FROM pg_control_system()"))
    xmin = cell.connection.select_value("SELECT xmin::text::bigint FROM users WHERE username = #{cell.connection.quote(name)}")
    expect(Integer(xid) % 2**32).to eq(xmin) # the user's row and the lease's row: one transaction
    expect(lookup(cell, :username, name)).to eq([cell.cell_id, "active"])
    expect(cell.leases_outstanding).to eq(0)
  end

  it "sends a destroy that frees claims in a plain destroy's three statements" do
    name = unique("leaving")
    user = cell.user.create!(username: name, email: "#{name}@example.com")
    TopologyClaims::Committer.instance.drain
    TopologyClaims.clean_up!(cell.connection)
    statements, sent = traced { expect(user.destroy).to be_truthy }

    expect(statements.size).to eq(3), statements.join("\n")
    expect(statements[0]).to start_with("BEGIN; WITH cleaned AS").or start_with("BEGIN; INSERT INTO leases_outstanding")
    expect(statements[1]).to start_with('DELETE FROM "users"')
    expect(statements[2]).to eq("COMMIT")
    expect(sent.size).to eq(1)
    expect(lookup(cell, :username, name)).to be_nil
    expect(lookup(cell, :email, "#{name}@example.com")).to be_nil
    expect(cell.leases_outstanding).to eq(0)
  end

  it "deletes the row again before COMMIT when the transaction has nothing to lease" do
    statements, sent = traced { unclaimed_model.create!(username: unique("unclaimed")) }

    expect(sent).to be_empty
    expect(statements.first).to start_with("BEGIN; INSERT INTO leases_outstanding")
    expect(statements[-2]).to start_with("DELETE FROM leases_outstanding")
    expect(rows.call).to eq(0)
  end

  it "leaves nothing of a row whose transaction is rolled back after the BEGIN, and the next save leases afresh" do
    name = unique("aborted")
    aborting = Class.new(cell.user) do
      before_save { self.class.connection.select_value("SELECT 1") && throw(:abort) }
    end
    SpecSupport.const_set(:AbortingUser, aborting) unless SpecSupport.const_defined?(:AbortingUser)
    statements, sent = traced { expect(SpecSupport::AbortingUser.new(username: name).save).to be(false) }

    expect(sent).to be_empty
    expect(statements.first).to start_with("BEGIN; INSERT INTO leases_outstanding")
    expect(statements.last).to eq("ROLLBACK")
    expect(rows.call).to eq(0)
    expect(lookup(cell, :username, name)).to be_nil

    later = unique("after-abort")
    statements, sent = traced { cell.user.create!(username: later) }
    expect(sent.size).to eq(1)
    expect(statements.first).to start_with("BEGIN; INSERT INTO leases_outstanding")
    expect(lookup(cell, :username, later)).to eq([cell.cell_id, "active"])
    expect(cell.leases_outstanding).to eq(0)
  end

  it "keeps the row's own statement under an isolation level, whose SET TRANSACTION must come first" do
    name = unique("serializable")
    statements, sent = traced do
      cell.user.transaction(isolation: :serializable) { cell.user.create!(username: name) }
    end

    expect(statements.first).to eq("BEGIN")
    expect(statements[1]).to start_with("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    expect(statements.grep(/leases_outstanding/).size).to eq(1)
    expect(sent.size).to eq(1)
    expect(lookup(cell, :username, name)).to eq([cell.cell_id, "active"])
    expect(cell.leases_outstanding).to eq(0)
  end

  it "keeps the row for the outer transaction when a savepoint after the BEGIN rolls back" do
    kept = unique("kept")
    dropped = unique("dropped")
    statements, sent = traced do
      cell.user.transaction do
        cell.user.create!(username: kept)
        cell.user.transaction(requires_new: true) do
          cell.user.create!(username: dropped)
          raise ActiveRecord::Rollback
        end
      end
    end

    expect(statements.first).to start_with("BEGIN; INSERT INTO leases_outstanding")
    expect(statements.grep(/leases_outstanding/).size).to eq(1)
    expect(sent.size).to eq(1)
    expect(lookup(cell, :username, kept)).to eq([cell.cell_id, "active"])
    expect(lookup(cell, :username, dropped)).to be_nil
    expect(cell.leases_outstanding).to eq(0)
  end

  it "fails a save whose row cannot be written at the BEGIN, naming the table, and leaves the connection usable" do
    cell.user.create!(username: unique("warm"))
    cell.connection.execute("ALTER TABLE leases_outstanding RENAME TO leases_outstanding_away")
    name = unique("no-table")
    begin
      expect { cell.user.create!(username: name) }
        .to raise_error(ActiveRecord::StatementInvalid, /relation "leases_outstanding" does not exist/)
      expect(cell.connection.transaction_open?).to be(false)
      expect(cell.connection.select_value("SELECT count(*) FROM users WHERE username = #{cell.connection.quote(name)}")).to eq(0)
    ensure
      cell.connection.execute("ALTER TABLE leases_outstanding_away RENAME TO leases_outstanding")
    end
    expect(lookup(cell, :username, name)).to be_nil
    later = unique("table-back")
    cell.user.create!(username: later)
    expect(lookup(cell, :username, later)).to eq([cell.cell_id, "active"])
    expect(cell.leases_outstanding).to eq(0)
  end

  it "keeps the row's own statement with row_at_begin = false" do
    config = cell.config.dup_with(row_at_begin: false)
    SpecSupport.const_set(:RowApartUser, Class.new(cell.user) { claims_configuration config }) unless SpecSupport.const_defined?(:RowApartUser)
    name = unique("row-apart")
    statements, sent = traced { SpecSupport::RowApartUser.create!(username: name) }

    expect(statements.first).to eq("BEGIN")
    expect(statements.grep(/leases_outstanding/).size).to eq(1)
    expect(sent.first).to match(/\Apg:\d+:\d+\z/)
    expect(lookup(cell, :username, name)).to eq([cell.cell_id, "active"])
  end

  it "leaves ActiveRecord's lazy transactions on: a save that writes nothing sends no BEGIN" do
    user = cell.user.create!(username: unique("lazy"))
    statements, sent = traced { expect(user.save).to be(true) }

    expect(sent).to be_empty
    expect(statements).to be_empty
  end
end
