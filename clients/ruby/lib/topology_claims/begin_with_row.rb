# frozen_string_literal: true

module TopologyClaims
  # On PostgreSQL, the leases_outstanding row of a save that is about to claim travels in the
  # round trip of its transaction's BEGIN: `BEGIN; <the row's statement>` is one simple query,
  # and the statement returns the transaction's id for BeginUpdate's local_transaction. A
  # claimed save then makes as many local round trips as a plain one (BEGIN, its INSERT or
  # UPDATE, COMMIT), plus its two calls (decision 125).
  #
  # The row is what it always was: written in the cell's transaction before BeginUpdate is sent,
  # committed or rolled back with it. Only its moment changes, from just before BeginUpdate to
  # the BEGIN. The save asks for it (Claimable#save, Collector#want_row); the BEGIN writes it only
  # for the outermost transaction of that save, never under an isolation level (its SET
  # TRANSACTION must come first). Anything else keeps the row's own statement before BeginUpdate.
  # A transaction that wrote the row and then has nothing to lease deletes it before its COMMIT.
  #
  # Prepended to the connection's adapter class at the first save that asks (install).
  module BeginWithRow
    def self.install(connection)
      klass = connection.class
      klass.prepend(self) unless klass.include?(self)
    end

    def begin_db_transaction
      collector = @topology_claims_collector
      return super unless collector&.row_at_begin?(self) && !@topology_claims_isolated

      collector.begin_with_row
    end

    def begin_isolated_db_transaction(isolation)
      @topology_claims_isolated = true
      super
    ensure
      @topology_claims_isolated = false
    end
  end
end
